"""Reads behind a session's page: the trace a page at a time (with its run and turn
boundaries), the failures in it, the timeline on an axis of active time, and tokens and
cost per turn. Each is a handful of queries whatever the session's length: pages are
keyset ranges of the (session, seq) index, failures come from the step_failed partial
index, and the timeline of a long session is aggregated in one pass."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import (
    BooleanField,
    Case,
    Count,
    F,
    FloatField,
    Func,
    Max,
    Min,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce

from agent_runtime.state import OperatorAction, PayloadField, SystemEvent, SystemPayload, stored

from ..models import (
    RUN_STARTED,
    STEP_FAILED,
    AgentSession,
    AuditEvent,
    Checkpoint,
    Step,
    payload_key,
    payload_q,
)
from .presenters import (
    GAP_COLLAPSE_SECONDS,
    KIND_LABEL,
    ActiveAxis,
    Gap,
    Scale,
    StepView,
    TraceContext,
    build_trace_items,
    ends_a_run,
    format_cost,
    format_count,
    format_duration,
    format_ms,
    nice_ticks,
    present_step,
    rounded,
    run_reason,
)

TRACE_PAGE = 50

KIND_FILTERS = {
    "user": ("user",),
    "model": ("model",),
    "tool": ("tool_call", "tool_result"),
    "error": ("error",),
    "operator": ("operator",),
    "system": ("system",),
}
STATUS_FILTERS = {
    "failed": STEP_FAILED,
    "retried": payload_q(PayloadField.ATTEMPTS, "gt", value=1, kind="tool_result"),
}


@dataclass
class TraceFilters:
    """What the trace shows: superseded steps or not, one kind, one status."""

    superseded: bool = False
    kind: str = ""
    status: str = ""
    errors: list[str] = field(default_factory=list)

    @classmethod
    def from_query(cls, params: Any) -> TraceFilters:
        f = cls(
            superseded=params.get("superseded") == "1",
            kind=params.get("kind") or "",
            status=params.get("status") or "",
        )
        if f.kind and f.kind not in KIND_FILTERS:
            f.errors.append(
                f"unknown step kind {f.kind!r} (one of: {', '.join(sorted(KIND_FILTERS))})"
            )
            f.kind = ""
        if f.status and f.status not in STATUS_FILTERS:
            f.errors.append(
                f"unknown step status {f.status!r} (one of: {', '.join(sorted(STATUS_FILTERS))})"
            )
            f.status = ""
        return f

    @property
    def grouped(self) -> bool:
        """Runs and turns are drawn only around the whole sequence of steps."""
        return not (self.kind or self.status)

    def query(self, **extra: Any) -> dict[str, str]:
        values = {
            "superseded": "1" if self.superseded else "",
            "kind": self.kind,
            "status": self.status,
        }
        values.update({k: str(v) for k, v in extra.items() if v not in (None, "")})
        return {k: v for k, v in values.items() if v}

    def apply(self, steps: QuerySet[Step]) -> QuerySet[Step]:
        if not self.superseded:
            steps = steps.filter(superseded_at__isnull=True)
        if self.kind:
            steps = steps.filter(kind__in=KIND_FILTERS[self.kind])
        if self.status:
            steps = steps.filter(STATUS_FILTERS[self.status])
        return steps


@dataclass
class TracePage:
    items: list[Any]
    views: list[StepView]
    more: bool
    last_seq: int  # the last seq shown (or `after` when nothing was)
    context: TraceContext  # for the page after this one


def trace_context(session: AgentSession, after: int, filters: TraceFilters) -> TraceContext:
    """Turns and runs before step `after`. Model steps are counted from the (session, kind,
    seq) index alone, less the few superseded ones (the step_superseded index), runs from
    the step_run_started index: one aggregate reading every row before `after` took 80 ms
    at step 100,000."""
    if after <= 0 or not filters.grouped:
        return TraceContext()
    before = Step.objects.filter(session=session, seq__lte=after)
    turns = before.filter(kind="model").count()
    if not filters.superseded:
        turns -= before.filter(superseded_at__isnull=False, kind="model").count()
    starts = before.filter(RUN_STARTED)
    if not filters.superseded:
        starts = starts.filter(superseded_at__isnull=True)
    runs = starts.aggregate(n=Count("id"), last=Max("seq"))
    worker = ""
    if runs["last"]:
        worker = str(
            Step.objects.filter(session=session, seq=runs["last"])
            .values_list(KT(payload_key(PayloadField.WORKER)), flat=True)
            .first()
            or ""
        )
    return TraceContext(turns, runs["n"], worker)


def trace_page(
    session: AgentSession,
    *,
    after: int,
    filters: TraceFilters,
    context: TraceContext | None = None,
    limit: int = TRACE_PAGE,
) -> TracePage:
    """The steps after `after`, presented, with their run and turn boundaries.

    `context` (turns and runs before, and the worker of the current run) comes from the
    page before when it is known (lazy loading, the live tail); otherwise it is counted."""
    steps = filters.apply(Step.objects.filter(session=session, seq__gte=max(after, 1)))
    rows = list(steps.order_by("seq")[: limit + 2])
    previous = None
    if rows and rows[0].seq == after:
        previous = rows.pop(0)  # context only: the page starts after it
    page, following = rows[:limit], (rows[limit] if len(rows) > limit else None)
    if context is None:
        context = trace_context(session, after, filters)
    context.previous = previous
    reasons: dict[int, list[str]] = {}
    if page:
        for seq, reason in Checkpoint.objects.filter(
            session=session, seq__gte=page[0].seq, seq__lte=page[-1].seq
        ).values_list("seq", "reason"):
            reasons.setdefault(seq, []).append(reason)
    views = [present_step(s, reasons.get(s.seq)) for s in page]
    starts = [v for v in views if v.kind == "system" and v.event == SystemEvent.RUN_STARTED]
    known = {s.seq: s for s in page}
    if previous is not None:
        known[previous.seq] = previous
    previous_steps: dict[int, Step] = {}
    resumes: list[tuple[datetime, str]] = []
    if filters.grouped and starts:
        wanted = [v.seq - 1 for v in starts if v.seq > 1]
        missing = [seq for seq in wanted if seq not in known]
        if missing:
            known.update({s.seq: s for s in Step.objects.filter(session=session, seq__in=missing)})
        previous_steps = {seq: known[seq] for seq in wanted if seq in known}
        later = [s for s in previous_steps.values() if s.seq > 1]
        if later:
            # Who resumed the session before a run (a resume writes no step, only this).
            first = min(s.created_at for s in later)
            resumes = list(
                AuditEvent.objects.filter(session=session, action="resume", created_at__gte=first)
                .order_by("created_at")
                .values_list("created_at", "actor_label")[:500]
            )
    stuck_worker = None
    if following is None and session.is_stuck():
        stuck_worker = session.lease_owner or "its worker"
    items, after_context = build_trace_items(
        views,
        context,
        previous_steps=previous_steps,
        resumes=resumes,
        next_step=following,
        stuck_worker=stuck_worker,
        grouped=filters.grouped,
    )
    return TracePage(
        items=items,
        views=views,
        more=following is not None,
        last_seq=page[-1].seq if page else after,
        context=after_context,
    )


@dataclass(frozen=True)
class Failures:
    first: int | None
    last: int | None
    count: int


def failures(session: AgentSession) -> Failures:
    """The first and last failed step of the live trace, and how many failed."""
    row = (
        Step.objects.filter(session=session, superseded_at__isnull=True)
        .filter(STEP_FAILED)
        .aggregate(first=Min("seq"), last=Max("seq"), count=Count("id"))
    )
    return Failures(row["first"], row["last"], row["count"])


def current_plan(session: AgentSession, state: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan as it stands now: the head checkpoint's, or a newer one a tool returned in a
    step after the head (a running session is ahead of its last checkpoint)."""
    if session.last_seq <= session.head:
        return _plan_items(state.get("plan") or [])
    update = (
        Step.objects.filter(
            payload_q("has_key", value=PayloadField.PLAN_UPDATE),
            session=session,
            seq__gt=session.head,
            kind="tool_result",
            superseded_at__isnull=True,
        )
        .order_by("-seq")
        .values_list(payload_key(PayloadField.PLAN_UPDATE), flat=True)
        .first()
    )
    return _plan_items(update if isinstance(update, list) else state.get("plan") or [])


def _plan_items(plan: list[Any]) -> list[dict[str, Any]]:
    return [
        {**p, "label": str(p.get("status") or "pending").replace("_", " ")}
        for p in plan
        if isinstance(p, dict)
    ]


# --- Timeline ---------------------------------------------------------------------------

TIMELINE_WINDOW = 150  # steps drawn one row each; a longer session gets an overview too
PLOT_LEFT, PLOT_WIDTH, LABEL_WIDTH = 200, 780, 196
OVERVIEW_BUCKETS = 195


class EpochSeconds(Func):
    """A timestamp as seconds since 1970 (a float): the timeline reads thousands of them,
    and a float is many times cheaper to load than a timestamp with a time zone."""

    template = "EXTRACT(EPOCH FROM %(expressions)s)::double precision"
    output_field = FloatField()

    def as_sqlite(self, compiler, connection, **extra):
        return self.as_sql(
            compiler,
            connection,
            template="((julianday(%(expressions)s) - 2440587.5) * 86400.0)",
            **extra,
        )


@dataclass
class TimelineRow:
    seq: int
    kind: str
    start: float  # seconds since 1970
    end: float
    failed: bool
    event: str
    name: str = ""
    branch: str = ""


def _timeline_rows(
    session: AgentSession,
    filters: TraceFilters,
    *,
    named: bool,
    seqs: tuple[int, int] | None,
    last: int | None = None,
) -> list[TimelineRow]:
    """Steps as bars: seq, kind, start and end (seconds), failed, event (and the name and
    branch to label them with): those between `seqs`, the `last` ones, or all."""
    steps = Step.objects.filter(session=session)
    if not filters.superseded:
        steps = steps.filter(superseded_at__isnull=True)
    if seqs:
        steps = steps.filter(seq__gte=seqs[0], seq__lte=seqs[1])
    if last:
        newest = steps.order_by("-seq").values_list("seq", flat=True)[last - 1 : last]
        steps = steps.filter(seq__gte=Coalesce(Subquery(newest), Value(0)))
    steps = steps.annotate(
        t0=EpochSeconds(Coalesce("started_at", "created_at")),
        t1=EpochSeconds(Coalesce("finished_at", "started_at", "created_at")),
        failed=Case(
            When(STEP_FAILED, then=Value(True)), default=Value(False), output_field=BooleanField()
        ),
        event_name=KT(payload_key(PayloadField.EVENT)),
    )
    columns = ["seq", "kind", "t0", "t1", "failed", "event_name"]
    if named:
        steps = steps.annotate(
            tool=KT(payload_key(PayloadField.NAME)),
            model=KT(payload_key(PayloadField.MODEL)),
            where=KT(payload_key(PayloadField.WHERE)),
            action_name=KT(payload_key(PayloadField.ACTION)),
            branch_index=KT(payload_key(PayloadField.BRANCH, PayloadField.INDEX)),
            branch_of=KT(payload_key(PayloadField.BRANCH, PayloadField.OF)),
        )
        columns += ["tool", "model", "where", "action_name", "branch_index", "branch_of"]
    rows = []
    for values in steps.order_by("seq").values_list(*columns):
        seq, kind, t0, t1, failed, event = values[:6]
        row = TimelineRow(seq, kind, t0, max(t1, t0), bool(failed), event or "")
        if named:
            tool, model, where, action, b_index, b_of = values[6:]
            row.name = str(event or tool or model or where or action or "")
            if b_index and kind in ("tool_call", "tool_result"):
                row.branch = f"{b_index}/{b_of}"
        rows.append(row)
    return rows


# System steps after which a session waits for a person's decision.
WAITS_FOR_A_PERSON = (
    SystemEvent.WAITING_FOR_APPROVAL,
    SystemEvent.UNCERTAIN_CALL,
    SystemEvent.BUDGET_REACHED,
)


def _gap_reason(after_kind: str, after_event: str, prev: Step | None) -> str:
    """What a session waited for in an idle gap: from the step that ended it, and the step
    just before that one (by seq)."""
    if after_kind == "operator":
        return "waiting for a person"
    if after_kind == "user":
        return "until a new message"
    if prev is not None and prev.event in WAITS_FOR_A_PERSON:
        return "waiting for a person"
    if after_event == SystemEvent.RUN_STARTED and prev is not None:
        if not ends_a_run(prev, prev.payload or {}):
            return "until another worker took over (crash)"
        if prev.kind == "error":
            return "failed, until resumed"
        if prev.action == OperatorAction.ROLLBACK:
            return "paused, until resumed"
        return "waiting for a worker"
    if after_event == SystemEvent.RUN_STARTED:
        return "waiting for a worker"
    return "idle"


@dataclass
class Timeline:
    empty: bool = True
    width: int = PLOT_LEFT + PLOT_WIDTH + 20
    height: int = 0
    overview: dict[str, Any] | None = None
    bars: list[dict[str, Any]] = field(default_factory=list)
    gaps: list[dict[str, Any]] = field(default_factory=list)
    ticks: list[dict[str, Any]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    window: tuple[int, int] | None = None  # the seqs drawn one row each
    total_steps: int = 0
    active: str = ""
    waited: str = ""
    wall: str = ""


def _steps_before(session: AgentSession, seqs: set[int]) -> dict[int, Step]:
    """seq -> the step just before it (by seq), for the given seqs (at most 2,000)."""
    wanted = sorted(seq - 1 for seq in seqs if seq > 1)[:2000]
    if not wanted:
        return {}
    found = Step.objects.filter(session=session, seq__in=wanted).only("seq", "kind", "payload")
    return {step.seq + 1: step for step in found}


def _stand_in(row: TimelineRow | None) -> Step | None:
    """A step as much as the timeline read of it (its kind and event)."""
    if row is None:
        return None
    payload = stored(SystemPayload(event=row.event)) if row.event else {}
    return Step(seq=row.seq, kind=row.kind, payload=payload)  # not stored


def _axis_for(rows: list[TimelineRow], previous_of: dict[int, Step]) -> ActiveAxis:
    """The axis of these rows; each long gap says what the session waited for (from the
    step that ended it and the one before that: fetched for run starts, else as read)."""
    import bisect

    by_start = sorted(rows, key=lambda r: (r.start, r.seq))
    starts = [r.start for r in by_start]
    by_seq = {r.seq: r for r in rows}

    def reasons(gap_start: float, gap_end: float) -> str:
        index = bisect.bisect_left(starts, gap_end)
        after = by_start[index] if index < len(by_start) else None
        if after is None:
            return "idle"
        prev = previous_of.get(after.seq) or _stand_in(by_seq.get(after.seq - 1))
        return _gap_reason(after.kind, after.event, prev)

    return ActiveAxis([(r.start, r.end) for r in rows], reasons)


def timeline(
    session: AgentSession,
    filters: TraceFilters,
    *,
    window: tuple[int, int] | None = None,
) -> Timeline:
    """The session's steps on an axis of active time: one row per step for a window of up
    to TIMELINE_WINDOW steps (the latest, or the seqs asked for), and for a longer session
    an overview of all of it in buckets, each a link to its steps."""
    return _cached_while_settled(
        session,
        f"timeline:{int(filters.superseded)}:" + ("-".join(map(str, window)) if window else ""),
        lambda: _timeline(session, filters, window),
    )


SETTLED_CACHE_SECONDS = 300


def _cached_while_settled(session: AgentSession, what: str, compute: Callable[[], Any]) -> Any:
    """A settled session's drawing, kept for a while: it changes only with a new step or a
    rollback, and either moves `last_seq` or `updated_at`, which are in the key. A live
    session's is drawn anew each time."""
    from django.core.cache import cache

    if session.status in ("queued", "running"):
        return compute()
    key = f"respawn:{what}:{session.id}:{session.last_seq}:{session.updated_at.timestamp():.6f}"
    found = cache.get(key)
    if found is None:
        found = compute()
        cache.set(key, found, SETTLED_CACHE_SECONDS)
    return found


def _timeline(
    session: AgentSession, filters: TraceFilters, window: tuple[int, int] | None
) -> Timeline:
    out = Timeline()
    visible = Step.objects.filter(session=session)
    if not filters.superseded:
        visible = visible.filter(superseded_at__isnull=True)
    out.total_steps = visible.count()
    if not out.total_steps:
        return out
    out.empty = False
    if window is None:
        rows = _timeline_rows(session, filters, named=True, seqs=None, last=TIMELINE_WINDOW)
    else:
        lo = max(window[0], 1)
        hi = max(min(window[1], lo + TIMELINE_WINDOW - 1), lo)
        rows = _timeline_rows(session, filters, named=True, seqs=(lo, hi))[:TIMELINE_WINDOW]
    previous_of = _steps_before(
        session, {r.seq for r in rows if r.event == SystemEvent.RUN_STARTED}
    )
    window_axis = _axis_for(rows, previous_of) if rows else ActiveAxis([])
    if out.total_steps > TIMELINE_WINDOW:
        draw = _overview_in_sql if connection.vendor == "postgresql" else _overview_in_python
        # Kept apart from the rows below: zooming to other steps draws the same overview.
        axis, out.overview = _cached_while_settled(
            session, f"overview:{int(filters.superseded)}", lambda: draw(session, filters)
        )
    else:
        axis = window_axis  # the window is the whole session
    out.active = format_duration(axis.active_seconds)
    out.wall = format_duration(axis.segments[-1][1] - axis.segments[0][0]) if axis.segments else ""
    out.waited = format_duration(sum(g.seconds for g in axis.gaps)) if axis.gaps else ""
    if not rows:
        return out
    out.window = (rows[0].seq, rows[-1].seq)
    scale = Scale.fit(window_axis, PLOT_LEFT, PLOT_WIDTH)
    top, row_h = 26, 14
    for index, row in enumerate(rows):
        x0, x1 = scale.x(row.start), scale.x(row.end)
        duration_ms = (row.end - row.start) * 1000
        label = f"#{row.seq} {KIND_LABEL.get(row.kind, row.kind)} {row.name}".strip()
        out.bars.append(
            {
                "seq": row.seq,
                "y": top + index * row_h,
                "x": x0,
                "w": max(x1 - x0, 2.0),
                "kind": row.kind,
                "failed": row.failed,
                "branch": row.branch,
                "label": label[:34],
                "title": f"{label}: {format_ms(duration_ms)}"
                + (" — failed" if row.failed else "")
                + (f" (branch {row.branch})" if row.branch else ""),
            }
        )
        if row.event == SystemEvent.RUN_STARTED:
            out.runs.append({"x": x0, "y": top + index * row_h, "seq": row.seq})
    for index, gap in enumerate(window_axis.gaps):
        out.gaps.append(_gap_view(gap, scale.gap_x(index), scale.break_px))
    usable = PLOT_LEFT + PLOT_WIDTH
    out.ticks = [
        {"x": scale.x_active(t), "label": format_duration(t) if t else "0"}
        for t in nice_ticks(window_axis.active_seconds)
        if scale.x_active(t) <= usable + 0.5
    ]
    out.height = top + len(rows) * row_h + 8
    out.bars, out.gaps, out.ticks, out.runs = (
        rounded(out.bars),
        rounded(out.gaps),
        rounded(out.ticks),
        rounded(out.runs),
    )
    return out


def _gap_view(gap: Gap, x: float, width: float) -> dict[str, Any]:
    return {"x": x, "w": width, "label": gap.label, "short": format_duration(gap.seconds)}


def _empty_buckets() -> list[dict[str, Any]]:
    return [
        {
            "steps": 0,
            "model": 0,
            "tool": 0,
            "other": 0,
            "failed": 0,
            "first_failed": None,
            "first": None,
            "last": None,
        }
        for _ in range(OVERVIEW_BUCKETS)
    ]


def _overview_in_python(
    session: AgentSession, filters: TraceFilters
) -> tuple[ActiveAxis, dict[str, Any]]:
    """The overview from every step read into Python (for databases without window
    functions to do it in; `_overview_in_sql` does the same on PostgreSQL)."""
    rows = _timeline_rows(session, filters, named=False, seqs=None)
    runs = [(r.seq, r.start) for r in rows if r.event == SystemEvent.RUN_STARTED]
    previous_of = _steps_before(session, {seq for seq, _ in runs})
    axis = _axis_for(rows, previous_of)
    scale = Scale.fit(axis, PLOT_LEFT, PLOT_WIDTH)
    column_w = PLOT_WIDTH / OVERVIEW_BUCKETS
    buckets = _empty_buckets()
    for row in rows:
        index = min(max(int((scale.x(row.start) - PLOT_LEFT) / column_w), 0), OVERVIEW_BUCKETS - 1)
        bucket = buckets[index]
        bucket["steps"] += 1
        kind = (
            "model" if row.kind == "model" else "tool" if row.kind.startswith("tool") else "other"
        )
        bucket[kind] += 1
        if row.failed:
            bucket["failed"] += 1
            bucket["first_failed"] = bucket["first_failed"] or row.seq
        bucket["first"] = bucket["first"] or row.seq
        bucket["last"] = row.seq
    return axis, _overview_view(buckets, axis, runs, previous_of)


# The steps of one session as the timeline reads them: start and end in seconds (no
# payload: reading every step's JSON cost more than all the rest).
_TIMELINE_STEPS = """
    SELECT seq, kind,
           EXTRACT(EPOCH FROM COALESCE(started_at, created_at))::double precision AS t0,
           GREATEST(
               EXTRACT(EPOCH FROM COALESCE(finished_at, started_at, created_at)),
               EXTRACT(EPOCH FROM COALESCE(started_at, created_at))
           )::double precision AS t1
    FROM sessions_app_step
    WHERE session_id = %(session)s AND (%(superseded)s OR superseded_at IS NULL)
"""
# Each step with the idle time before it: from the latest end of any step that started
# before it (steps ordered by start, as ActiveAxis orders them).
_WITH_GAPS = f"""
    WITH s AS ({_TIMELINE_STEPS}),
    g AS (
        SELECT s.*, t0 - MAX(t1) OVER (
            ORDER BY t0, seq ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
        ) AS gap
        FROM s
    )
"""
# In one pass: the span and its long gaps (rows "T" and "G"), and the steps counted per
# column of the active-time axis ("B"): a step's x is its start less the long gaps before
# it, plus a break's width per gap, scaled as Scale.fit scales (the same formula).
_OVERVIEW = (
    _WITH_GAPS
    + """,
    a AS (
        SELECT g.*,
            SUM(CASE WHEN gap > %(collapse)s THEN gap ELSE 0 END) OVER w AS collapsed,
            COUNT(*) FILTER (WHERE gap > %(collapse)s) OVER w AS breaks
        FROM g WINDOW w AS (ORDER BY t0, seq)
    ),
    t AS (
        SELECT MIN(t0) AS first, MAX(t1) AS last,
               COALESCE(SUM(gap) FILTER (WHERE gap > %(collapse)s), 0) AS waited,
               COUNT(*) FILTER (WHERE gap > %(collapse)s) AS n
        FROM g
    ),
    k AS (
        SELECT t.*,
            CASE WHEN n * 22 <= %(width)s / 3.0 THEN 22.0
                 ELSE GREATEST(%(width)s / 3.0 / GREATEST(n, 1), 1.0) END AS bp,
            GREATEST(last - first - waited, 0.001) AS active
        FROM t
    )
    SELECT 'B' AS row, LEAST(GREATEST(FLOOR(
               ((a.t0 - k.first - a.collapsed) * ((%(width)s - k.bp * k.n) / k.active)
                + a.breaks * k.bp) / %(column_w)s), 0), %(last_column)s)::integer,
           COUNT(*)::integer,
           (COUNT(*) FILTER (WHERE a.kind = 'model'))::integer,
           (COUNT(*) FILTER (WHERE a.kind IN ('tool_call', 'tool_result')))::integer,
           MIN(a.seq), MAX(a.seq), NULL::double precision, NULL::double precision
    FROM a CROSS JOIN k GROUP BY 2
    UNION ALL
    SELECT 'T', NULL, NULL, NULL, NULL, NULL, NULL, first, last FROM t
    UNION ALL
    (SELECT 'G', NULL, NULL, NULL, NULL, seq, NULL, t0 - gap, t0
     FROM g WHERE gap > %(collapse)s ORDER BY t0, seq LIMIT 5000)
"""
)


def _overview_in_sql(
    session: AgentSession, filters: TraceFilters
) -> tuple[ActiveAxis, dict[str, Any]]:
    """The overview of a long session computed by PostgreSQL in one statement: the long
    gaps (a window function over the steps ordered by start), and the steps counted per
    column of the active-time axis (a running sum of the collapsed gaps). Python sees a few
    hundred rows whatever the session's length: at 100,000 steps, reading every step into
    Python took over a second."""
    params: dict[str, Any] = {
        "session": session.id,
        "superseded": filters.superseded,
        "collapse": GAP_COLLAPSE_SECONDS,
        "width": float(PLOT_WIDTH),
        "column_w": PLOT_WIDTH / OVERVIEW_BUCKETS,
        "last_column": OVERVIEW_BUCKETS - 1,
    }
    with connection.cursor() as cursor:
        cursor.execute(_OVERVIEW, params)
        rows = cursor.fetchall()
    buckets = _empty_buckets()
    gap_rows, first, end = [], 0.0, 0.0
    for row, column, steps, model, tool, lo, hi, t0, t1 in rows:
        if row == "B":
            buckets[column].update(
                steps=steps, model=model, tool=tool, other=steps - model - tool, first=lo, last=hi
            )
        elif row == "T":
            first, end = t0, t1
        else:
            gap_rows.append((t0, t1, lo))
    gap_rows.sort()
    # Failed steps from their own index, each in the column whose steps it falls among.
    failed = Step.objects.filter(session=session).filter(STEP_FAILED)
    if not filters.superseded:
        failed = failed.filter(superseded_at__isnull=True)
    columns = [(b["first"], b["last"], b) for b in buckets if b["steps"]]
    for seq in failed.order_by("seq").values_list("seq", flat=True)[:5000]:
        for lo, hi, bucket in columns:
            if lo <= seq <= hi:
                bucket["failed"] += 1
                bucket["first_failed"] = bucket["first_failed"] or seq
                break
    starts = Step.objects.filter(RUN_STARTED, session=session)
    if not filters.superseded:
        starts = starts.filter(superseded_at__isnull=True)
    runs = list(
        starts.order_by("seq")
        .annotate(t0=EpochSeconds(Coalesce("started_at", "created_at")))
        .values_list("seq", "t0")[:500]
    )
    # The steps that ended each long gap and the steps before them and before each run:
    # what the session waited for, and why each run started.
    ended = {seq for _, _, seq in gap_rows}
    wanted = ended | {seq - 1 for seq in ended} | {seq - 1 for seq, _ in runs}
    around = {
        step.seq: step
        for step in Step.objects.filter(session=session, seq__in=sorted(wanted)[:6000]).only(
            "seq", "kind", "payload"
        )
    }
    gaps = []
    for busy, t0, seq in gap_rows:
        after = around.get(seq)
        event = after.event if after is not None else ""
        kind = after.kind if after is not None else ""
        gaps.append((busy, t0, _gap_reason(kind, event, around.get(seq - 1))))
    axis = ActiveAxis.from_gaps(first, end, gaps)
    previous_of = {seq: around[seq - 1] for seq, _ in runs if seq - 1 in around}
    return axis, _overview_view(buckets, axis, runs, previous_of)


def _overview_view(
    buckets: list[dict[str, Any]],
    axis: ActiveAxis,
    runs: list[tuple[int, float]],
    previous_of: dict[int, Step],
) -> dict[str, Any]:
    """The whole session in OVERVIEW_BUCKETS columns: steps per column by kind, failures
    marked, run starts (crashes marked) as lines; each column zooms to its steps."""
    scale = Scale.fit(axis, PLOT_LEFT, PLOT_WIDTH)
    column_w = PLOT_WIDTH / OVERVIEW_BUCKETS
    peak = max(b["steps"] for b in buckets) or 1
    height, top = 60, 18
    base = top + height
    columns = []
    for index, b in enumerate(buckets):
        if not b["steps"]:
            continue
        h_model = height * b["model"] / peak
        h_tool = height * b["tool"] / peak
        h_other = height * b["other"] / peak
        columns.append(
            {
                "x": PLOT_LEFT + index * column_w,
                "w": max(column_w - 0.6, 1.0),
                "first": b["first"],
                "last": b["last"],
                "failed": b["failed"],
                "first_failed": b["first_failed"],
                "segments": [
                    {"cls": "model", "y": base - h_model, "h": h_model},
                    {"cls": "tool", "y": base - h_model - h_tool, "h": h_tool},
                    {"cls": "other", "y": base - h_model - h_tool - h_other, "h": h_other},
                ],
                "title": (
                    f"steps #{b['first']}–#{b['last']}: {format_count(b['steps'])} steps "
                    f"({format_count(b['model'])} model, {format_count(b['tool'])} tool)"
                    + (f", {format_count(b['failed'])} failed" if b["failed"] else "")
                ),
            }
        )
    run_marks = []
    for number, (seq, start) in enumerate(runs, start=1):
        why = run_reason(number, previous_of.get(seq), None, None)
        run_marks.append(
            {
                "x": scale.x(start),
                "seq": seq,
                "crash": why.reason == "crash",
                "title": f"run {number} (#{seq}): {why.text}",
            }
        )
    gaps = [_gap_view(g, scale.gap_x(i), scale.break_px) for i, g in enumerate(axis.gaps)]
    # Label only the longest gaps: a session of many short waits would be unreadable.
    longest = sorted(range(len(gaps)), key=lambda i: -axis.gaps[i].seconds)
    for i in longest[5:]:
        gaps[i]["short"] = ""
    return {
        "columns": rounded(columns),
        "runs": rounded(run_marks),
        "gaps": rounded(gaps),
        "top": top,
        "height": top + height + 16,
        "base": base,
        "peak": peak,
    }


# --- Tokens and cost per turn -----------------------------------------------------------

USAGE_BARS = 120


def usage_per_turn(session: AgentSession, filters: TraceFilters) -> dict[str, Any]:
    """Tokens (in and out) and cost of each model turn; more turns than USAGE_BARS are
    summed in groups of consecutive turns (by step number)."""
    return _cached_while_settled(
        session, f"usage:{int(filters.superseded)}", lambda: _usage_per_turn(session, filters)
    )


def _usage_per_turn(session: AgentSession, filters: TraceFilters) -> dict[str, Any]:
    models = Step.objects.filter(session=session, kind="model")
    if not filters.superseded:
        models = models.filter(superseded_at__isnull=True)
    span = models.aggregate(first=Min("seq"), last=Max("seq"), turns=Count("id"))
    if not span["turns"]:
        return {"empty": True}
    per_bar = max(-(-span["turns"] // USAGE_BARS), 1)
    # Consecutive turns per bar, by step number: turns are spread evenly enough over a
    # session's steps, and a GROUP BY over seq ranges needs no window function.
    seq_span = span["last"] - span["first"] + 1
    width_seqs = max(-(-seq_span * per_bar // span["turns"]), 1) if per_bar > 1 else 1
    # A session that reported no cost has none in any turn: no payload is read for it.
    cost: Any = Value(0.0)
    if session.cost:
        cost = Cast(KT(payload_key(PayloadField.USAGE, PayloadField.COST)), FloatField())
    if per_bar == 1:
        rows = list(
            models.order_by("seq").values_list(
                "seq", "seq", "tokens_in", "tokens_out", Coalesce(cost, Value(0.0)), Value(1)
            )
        )
    else:
        rows = list(
            models.annotate(bar=(F("seq") - span["first"]) / width_seqs)
            .values("bar")
            .annotate(
                a=Min("seq"),
                b=Max("seq"),
                tin=Sum("tokens_in"),
                tout=Sum("tokens_out"),
                c=Sum(Coalesce(cost, Value(0.0))),
                n=Count("id"),
            )
            .order_by("bar")
            .values_list("a", "b", "tin", "tout", "c", "n")
        )
    peak = max((r[2] or 0) + (r[3] or 0) for r in rows) or 1
    peak_cost = max(float(r[4] or 0) for r in rows)
    left, width, height, top = 60, 900, 120, 14
    bar_w = min(width / max(len(rows), 1), 36.0)
    bars = []
    turn = 0
    cost_points = []
    for index, (first, _last, tin, tout, c, n) in enumerate(rows):
        tin, tout, c = tin or 0, tout or 0, float(c or 0)
        turn += n
        x = left + index * bar_w
        h_in = height * tin / peak
        h_out = height * tout / peak
        label = f"turn {turn}" if n == 1 else f"turns {turn - n + 1}–{turn}"
        bars.append(
            {
                "x": x,
                "w": max(bar_w - 1, 1),
                "first": first,
                "y_in": top + height - h_in,
                "h_in": h_in,
                "y_out": top + height - h_in - h_out,
                "h_out": h_out,
                "title": f"{label} (#{first}): {format_count(tin)} tokens in, "
                f"{format_count(tout)} out" + (f", cost {format_cost(c)}" if c else ""),
            }
        )
        if peak_cost:
            cost_points.append(f"{x + bar_w / 2:.1f},{top + height - height * c / peak_cost:.1f}")
    return {
        "empty": False,
        "bars": rounded(bars),
        "turns": span["turns"],
        "per_bar": per_bar,
        "peak": format_count(peak),
        "peak_cost": format_cost(peak_cost),
        "cost_line": " ".join(cost_points),
        "left": left,
        "width": left + width + 10,
        "height": top + height + 18,
        "base": top + height,
        "top": top,
    }
