"""Reads that need care: filtered keyset pages, counts, the attention queue, previews."""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
import uuid
from dataclasses import asdict, dataclass, field
from datetime import date, datetime, time, timedelta
from typing import Any, TypeVar, cast

from django.conf import settings
from django.db import connection
from django.db.models import Count, Exists, F, Max, Model, OuterRef, Q, QuerySet, Sum, TextField
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, TruncHour
from django.utils import timezone

from agent_runtime.agents import Agent, version_key
from agent_runtime.compat import session_problems
from agent_runtime.runners import DescribedRunner, RunnerDescription, ToolDescription
from agent_runtime.state import (
    SCHEMA_VERSION,
    STATE_BUDGETS,
    Budgets,
    OperatorAction,
    PayloadField,
    SessionState,
    StateError,
    SystemEvent,
    SystemPayload,
    apply_budgets,
    as_tool_call,
    stored,
)
from agent_runtime.tools import ToolRegistry
from agent_runtime.upgraders import IncompatibleSchemaError

from ..formats import format_duration
from ..models import (
    FINAL,
    LOADABLE,
    AgentSession,
    ApiToken,
    AuditAction,
    AuditEvent,
    Checkpoint,
    ImportedAuditRecord,
    Kind,
    ModelUsage,
    SessionNote,
    Status,
    Step,
    StepSearch,
    Team,
    payload_key,
    payload_q,
)
from ..models.clock import database_clock
from ..permissions import EVERYTHING, Scope, session_scope
from ..runtime import agent_registry
from ..sdk_glue import PROGRAM_AGENTS
from ..store import LATE_CALL_ACTION, session_store
from ..validation import InvalidInput, check_datetime, parse_date

SORTS = {
    "-updated": ("-updated_at", "-id"),
    "updated": ("updated_at", "id"),
    "-created": ("-created_at", "-id"),
    "created": ("created_at", "id"),
}


_Row = TypeVar("_Row", bound=Model)


class BadFilter(ValueError):
    pass


MAX_SEARCH = 200


@dataclass
class SessionFilters:
    q: str = ""
    status: str = ""
    agent: str = ""
    agent_version: str = ""  # the version sessions started on
    created_from: date | None = None
    created_to: date | None = None
    updated_from: date | None = None
    updated_to: date | None = None
    sort: str = "-updated"
    # The work queue: "me", "unassigned" or a username, as asked; `owner_id` the user it
    # names (None for "unassigned", or when there is no owner filter).
    owner: str = ""
    owner_id: int | None = None
    errors: list[str] = field(default_factory=list)
    # The sessions the reader may see (permissions.session_scope): from_query sets it from
    # the user it is given.
    scope: Scope = EVERYTHING

    @classmethod
    def from_query(cls, params: Any, user: Any = None) -> SessionFilters:
        """Every filter of the list, checked the same way: a bad value is named in an error
        and dropped, and the others still apply. `user` is who reads (their scope) and
        who "owner=me" means."""
        f = cls(
            scope=session_scope(user) if user is not None else EVERYTHING,
            q=" ".join((params.get("q") or "").split()),
            status=params.get("status") or "",
            agent=(params.get("agent") or "").strip(),
            agent_version=(params.get("agent_version") or "").strip()[:50],
            sort=params.get("sort") or "-updated",
        )
        if len(f.q) > MAX_SEARCH:
            f.errors.append(f"search: at most {MAX_SEARCH} characters (the rest was left out)")
            f.q = f.q[:MAX_SEARCH]
        if f.status and f.status not in Status.values:
            f.errors.append(f"unknown status {f.status!r}")
            f.status = ""
        if f.agent and (f.agent not in agent_names() or not f.scope.allows(f.agent)):
            # An agent no longer registered still has its sessions: unknown only if none.
            visible = AgentSession.objects.filter(f.scope.q(), agent=f.agent)
            if len(f.agent) > 100 or not visible.exists():
                f.errors.append(f"unknown agent {f.agent[:100]!r}")
                f.agent = ""
        if f.sort not in SORTS:
            f.errors.append(f"unknown sort {f.sort!r}")
            f.sort = "-updated"
        owner = (params.get("owner") or "").strip()
        if owner:
            try:
                f.owner_id = owner_id(owner, user)
                f.owner = owner
            except BadFilter as exc:
                f.errors.append(str(exc))
        for name in ("created_from", "created_to", "updated_from", "updated_to"):
            raw = (params.get(name) or "").strip()
            if raw:
                try:
                    setattr(f, name, parse_date(raw, name.replace("_", " ")))
                except InvalidInput as exc:
                    f.errors.append(str(exc))
        for what in ("created", "updated"):
            start, end = getattr(f, f"{what}_from"), getattr(f, f"{what}_to")
            if start and end and start > end:
                f.errors.append(f"{what}: the first date ({start}) is after the second ({end})")
                setattr(f, f"{what}_to", None)
        return f

    def as_query(self, **override: Any) -> dict[str, str]:
        values = {
            "q": self.q,
            "status": self.status,
            "agent": self.agent,
            "agent_version": self.agent_version,
            "created_from": self.created_from.isoformat() if self.created_from else "",
            "created_to": self.created_to.isoformat() if self.created_to else "",
            "updated_from": self.updated_from.isoformat() if self.updated_from else "",
            "updated_to": self.updated_to.isoformat() if self.updated_to else "",
            "sort": self.sort if self.sort != "-updated" else "",
            "owner": self.owner,
        }
        values.update({k: v for k, v in override.items()})
        return {k: str(v) for k, v in values.items() if v not in (None, "")}

    @property
    def is_filtered(self) -> bool:
        """Anything narrowing the list besides its status."""
        return bool(
            self.q
            or self.owner
            or self.agent
            or self.agent_version
            or self.created_from
            or self.created_to
            or self.updated_from
            or self.updated_to
        )


OWNER_ME = "me"
OWNER_NONE = "unassigned"
MAX_OWNER = 150  # django.contrib.auth's username column


def owner_id(owner: str, user: Any = None) -> int | None:
    """The user an owner filter names: `me` (the `user` asking), `unassigned` (None: the
    sessions nobody owns) or a username. BadFilter naming the problem otherwise."""
    from django.contrib.auth import get_user_model

    if owner == OWNER_NONE:
        return None
    if owner == OWNER_ME:
        if user is None or not getattr(user, "is_authenticated", False):
            raise BadFilter("owner=me: nobody is signed in")
        return int(user.pk)
    if len(owner) > MAX_OWNER:
        raise BadFilter(f"owner: at most {MAX_OWNER} characters")
    found = get_user_model().objects.filter(username=owner).values_list("pk", flat=True).first()
    if found is None:
        raise BadFilter(
            f"unknown owner {owner[:80]!r} (a username, {OWNER_ME!r} or {OWNER_NONE!r})"
        )
    return int(found)


def owner_q(user_id: int | None) -> Q:
    """Sessions the user owns; nobody's (the queue) when None."""
    return Q(owner__isnull=True) if user_id is None else Q(owner_id=user_id)


def api_owner_q(owner: str, user: Any) -> Q:
    """The API list's owner filter: `me`, `unassigned` or a username, which like an
    agent's name is a filter, not a reference: one no user has matches no session."""
    if owner in (OWNER_ME, OWNER_NONE):
        return owner_q(owner_id(owner, user))
    return Q(owner__username=owner)


def with_busy_workers(
    sessions: QuerySet[AgentSession], now: datetime | None = None
) -> QuerySet[AgentSession]:
    """The sessions, each knowing whether a worker is busy (AgentSession.is_stuck asks):
    one subquery for the whole page instead of one query per row."""
    return cast(
        "QuerySet[AgentSession]", sessions.annotate(busy_workers=AgentSession.workers_busy(now))
    )


def first_rows(rows: QuerySet[_Row], size: int) -> tuple[list[_Row], bool]:
    """The first `size` rows of an ordered query, and whether more follow (one row more
    is read: no COUNT)."""
    page = list(rows[: size + 1])
    return page[:size], len(page) > size


def _day_start(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min), timezone.get_current_timezone())


def step_search_matches(q: str) -> QuerySet:
    """Rows with a `session` whose steps contain the words of q: on PostgreSQL the search
    index the workers keep (StepSearch, served by its GIN index; the newest few seconds
    of steps may not be in it yet: sessions_app.upkeep.search.lag), icontains over the steps
    themselves elsewhere."""
    if connection.vendor == "postgresql":
        from django.contrib.postgres.search import SearchQuery

        return StepSearch.objects.filter(tsv=SearchQuery(q, config="simple", search_type="plain"))
    return Step.objects.annotate(text=Cast("payload", TextField())).filter(text__icontains=q)


def visible_sessions(scope: Scope) -> QuerySet[AgentSession]:
    """Every session `scope` (permissions.session_scope) lets its reader see: where every
    read of sessions on someone's behalf starts."""
    return AgentSession.objects.filter(scope.q())


def filtered_sessions(f: SessionFilters, *, with_status: bool = True) -> QuerySet[AgentSession]:
    sessions = visible_sessions(f.scope)
    if f.status and with_status:
        sessions = sessions.filter(status=f.status)
    if f.agent:
        sessions = sessions.filter(agent=f.agent)
    if f.agent_version:
        sessions = sessions.filter(agent_version=f.agent_version)
    if f.owner:
        sessions = sessions.filter(owner_q(f.owner_id))
    if f.created_from:
        sessions = sessions.filter(created_at__gte=_day_start(f.created_from))
    if f.created_to:
        sessions = sessions.filter(created_at__lt=_day_start(f.created_to + timedelta(days=1)))
    if f.updated_from:
        sessions = sessions.filter(updated_at__gte=_day_start(f.updated_from))
    if f.updated_to:
        sessions = sessions.filter(updated_at__lt=_day_start(f.updated_to + timedelta(days=1)))
    if f.q:
        try:
            return sessions.filter(id=uuid.UUID(f.q))
        except ValueError:
            pass
        in_steps = Exists(step_search_matches(f.q).filter(session=OuterRef("pk")))
        sessions = sessions.filter(Q(title__icontains=f.q) | in_steps)
    return sessions


def encode_cursor(session: AgentSession, sort: str) -> str:
    field_name = SORTS[sort][0].lstrip("-")
    value = getattr(session, field_name).isoformat()
    return base64.urlsafe_b64encode(f"{value}|{session.id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode((cursor + "=" * (-len(cursor) % 4)).encode()).decode()
        stamp, _, session_id = raw.partition("|")
        value = check_datetime(datetime.fromisoformat(stamp), "cursor")
        return value, uuid.UUID(session_id)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise BadFilter(
            "that page link is broken (bad cursor); start from the first page"
        ) from None


def _beyond(f: SessionFilters, cursor: str, *, forward: bool) -> Q:
    """Rows after the cursor in the list's order (forward), or before it."""
    order = SORTS[f.sort]
    field_name = order[0].lstrip("-")
    value, last_id = decode_cursor(cursor)
    later = order[0].startswith("-") == forward  # descending and forward: smaller values
    op = "lt" if later else "gt"
    return Q(**{f"{field_name}__{op}": value}) | Q(**{field_name: value, f"id__{op}": last_id})


@dataclass
class SessionPage:
    rows: list[AgentSession]
    next_cursor: str | None  # the rows after these
    prev_cursor: str | None  # the rows before these (None on the first page)
    start: int  # position of the first row, from 1 (0 when there are none)


def session_page(
    f: SessionFilters,
    cursor: str | None,
    size: int,
    *,
    before: str | None = None,
    position: int | None = None,
) -> SessionPage:
    """One keyset page (no OFFSET): rows after `cursor` in the chosen order, or the rows
    just before `before` (the previous page). `position` is where the page starts (from 1)
    when the link says so; otherwise it is counted."""
    order = SORTS[f.sort]
    # Whether a worker is busy, once for the page: what each row's stuck badge asks.
    sessions = with_busy_workers(filtered_sessions(f)).select_related("owner")
    if before:
        reverse = tuple(o[1:] if o.startswith("-") else f"-{o}" for o in order)
        rows = list(
            sessions.filter(_beyond(f, before, forward=False)).order_by(*reverse)[: size + 1]
        )
        has_before = len(rows) > size
        rows = list(reversed(rows[:size]))
        if not has_before and len(rows) < size:
            # Fewer than a page before it: show the first page in full.
            return session_page(f, None, size, position=1)
        next_cursor = encode_cursor(rows[-1], f.sort) if rows else None
        prev_cursor = encode_cursor(rows[0], f.sort) if has_before and rows else None
    else:
        if cursor:
            sessions = sessions.filter(_beyond(f, cursor, forward=True))
        rows, more = first_rows(sessions.order_by(*order), size)
        next_cursor = encode_cursor(rows[-1], f.sort) if more and rows else None
        prev_cursor = encode_cursor(rows[0], f.sort) if cursor and rows else None
    if not rows:
        return SessionPage([], None, prev_cursor, 0)
    if position is None or position < 1:
        position = 1 if not prev_cursor else rows_before(f, encode_cursor(rows[0], f.sort)) + 1
    return SessionPage(rows, next_cursor, prev_cursor, position)


POSITION_CAP = 100_000


def rows_before(f: SessionFilters, cursor: str) -> int:
    """How many rows of the list come before the cursor's row (up to POSITION_CAP): the
    position of a page reached by a link that did not carry it."""
    before = filtered_sessions(f).filter(_beyond(f, cursor, forward=False))
    return before[:POSITION_CAP].count()


COUNTS_CACHE_SECONDS = 5
SEARCH_COUNT_CAP = 10_000


@dataclass(frozen=True)
class StatusTotals:
    counts: dict[str, int]
    capped: bool  # counted up to SEARCH_COUNT_CAP rows only (a search)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def of(self, status: str) -> int:
        return self.counts.get(status, 0) if status else self.total


def status_totals(
    f: SessionFilters | None = None, *, fresh: bool = False, cached_only: bool = False
) -> StatusTotals | None:
    """Sessions per status under the list's filters (all but the status itself), so the
    counts add up to the rows the list pages through. A GROUP BY over the matching sessions
    (~170 ms at 1,000,000 rows unfiltered), cached for a few seconds: every open list polls
    it. A search is counted up to SEARCH_COUNT_CAP matches. `cached_only`: None rather
    than counting."""
    from django.core.cache import cache

    f = f or SessionFilters()
    # "owner=me" is someone else's list for each person: keyed by whom it names.
    # So is a team's: keyed by the agents its scope holds.
    agents = None if f.scope.agents is None else sorted(f.scope.agents)
    filters = repr((sorted(f.as_query(status="", sort="").items()), f.owner_id, agents)).encode()
    key = "respawn:status-totals:" + hashlib.sha256(filters).hexdigest()[:32]
    cached = None if fresh else cache.get(key)
    if cached is not None or cached_only:
        return cached
    counts = dict.fromkeys(Status.values, 0)
    sessions = filtered_sessions(f, with_status=False)
    if f.q:
        sessions = AgentSession.objects.filter(id__in=sessions.values("id")[: SEARCH_COUNT_CAP + 1])
    for row in sessions.values("status").annotate(n=Count("id")).order_by():
        counts[row["status"]] = row["n"]
    totals = StatusTotals(counts, bool(f.q) and sum(counts.values()) > SEARCH_COUNT_CAP)
    cache.set(key, totals, COUNTS_CACHE_SECONDS)
    return totals


def status_counts(scope: Scope = EVERYTHING) -> dict[str, int]:
    """Sessions per status, over every session in scope (cached for a few seconds)."""
    totals = status_totals(SessionFilters(scope=scope))
    assert totals is not None
    return dict(totals.counts)


def agent_names(scope: Scope = EVERYTHING) -> list[str]:
    """The agents `scope` covers, for choices and filters: this process's registry, and for
    a team's scope every agent its teams own too (a LangGraph graph's or an SDK agent's
    name, or an imported one, is in no registry but is still that team's)."""
    names = {name for name in agent_registry().names() if scope.allows(name)}
    if scope.agents is not None:
        names |= scope.agents
    return sorted(names)


@dataclass(frozen=True)
class AgentChoice:
    """An agent a person may start a session of, with the limits it runs under unless
    the session sets its own."""

    name: str
    description: str
    version: str
    max_steps: int
    max_tokens: int | None
    max_cost: float | None
    max_seconds: float | None


def startable_agents(scope: Scope = EVERYTHING) -> list[AgentChoice]:
    """The registered agents, by name: what a new session may run (those of `scope`,
    permissions.operate_scope, for someone who may act on some agents only)."""
    return [
        AgentChoice(
            name=agent.name,
            description=agent.description,
            version=agent.version,
            max_steps=agent.limits.max_steps,
            max_tokens=agent.limits.max_tokens,
            max_cost=agent.limits.max_cost,
            max_seconds=agent.limits.max_seconds,
        )
        for agent in agent_registry()
        if scope.allows(agent.name)
    ]


@dataclass(frozen=True)
class ToolView:
    name: str
    description: str
    parameters: list[dict[str, Any]]  # name, type, required, description
    schema: str  # the JSON schema, pretty-printed
    json_schema: dict[str, Any]  # the same, as data (the API's)
    idempotent: bool | None  # None: a runner's tool, which Respawn does not run
    needs_approval: bool
    timeout: float | None
    retries: int


@dataclass(frozen=True)
class AgentView:
    name: str
    version: str
    description: str
    kind: str  # "Respawn's loop", or what its runner runs ("LangGraph graph", ...)
    model: str
    instructions: str  # the text, or which function computes it
    source: str  # where it was found: RESPAWN_AGENTS entry or entry point
    limits: Any  # None: a runner runs the turn, Respawn applies no limits of its own
    state_version: int | None
    state_upgraders: list[int]
    compatible_since: str | None
    tools: list[ToolView]
    live: list[tuple[str, int]]  # (version started on, live sessions), newest first
    live_total: int
    nodes: list[str] = field(default_factory=list)  # a graph's nodes


@dataclass(frozen=True)
class AgentsOverview:
    agents: list[AgentView]
    # Agents with live sessions that this deployment does not have: (name, live sessions)
    missing: list[tuple[str, int]]
    # Sessions programs run themselves (program_agents): (name, which program, live sessions)
    by_program: list[tuple[str, str, int]] = field(default_factory=list)


def _parameters(schema: dict[str, Any]) -> list[dict[str, Any]]:
    required = set(schema.get("required") or [])
    parameters = []
    for name, prop in (schema.get("properties") or {}).items():
        kind = prop.get("type") or " | ".join(
            p.get("type", "?") for p in prop.get("anyOf", []) if isinstance(p, dict)
        )
        parameters.append(
            {
                "name": name,
                "type": kind or "object",
                "required": name in required,
                "default": prop.get("default"),
                "description": prop.get("description", ""),
            }
        )
    return parameters


def _tool_view(tool: Any) -> ToolView:
    import json

    schema = tool.spec.parameters
    return ToolView(
        name=tool.name,
        description=tool.description,
        parameters=_parameters(schema),
        schema=json.dumps(schema, indent=2, sort_keys=True),
        json_schema=schema,
        idempotent=tool.idempotent,
        needs_approval=tool.needs_approval,
        timeout=tool.timeout,
        retries=tool.retries,
    )


def _runner_tool_view(tool: ToolDescription) -> ToolView:
    import json

    return ToolView(
        name=tool.name,
        description=tool.description,
        parameters=_parameters(tool.parameters),
        schema=json.dumps(tool.parameters, indent=2, sort_keys=True),
        json_schema=tool.parameters,
        idempotent=None,
        needs_approval=tool.needs_approval,
        timeout=None,
        retries=0,
    )


def runner_description(agent: Agent) -> RunnerDescription | None:
    """What an agent's runner says it runs (agent_runtime.runners.DescribedRunner), or
    None: Respawn's own loop, or a runner that does not say."""
    if isinstance(agent.runner, DescribedRunner):
        return agent.runner.describe()
    return None


# How many of a session's latest steps the header looks through for a recorded model.
MODEL_LOOKBACK = 500


def session_model(session: AgentSession, configured: str) -> str:
    """The model a session's header names: the one its agent is configured with
    (`configured`, the deployment's RESPAWN_MODEL or Respawn's agent's), else the one its
    runner says it calls, else the one its last model step recorded (or a graph's last
    task that wrote a model's message: sessions_app.langgraph) among its latest
    MODEL_LOOKBACK steps."""
    if configured and configured != "unknown agent":
        return configured
    registry = agent_registry()
    if session.agent in registry:
        described = runner_description(registry.get(session.agent))
        if described is not None and described.model:
            return described.model
    graph_model = payload_q(PayloadField.MODEL, "isnull", value=False, kind="system")
    payload = (
        Step.objects.filter(Q(kind="model") | graph_model, session=session)
        # The header polls while a session runs: read a bounded range of its latest steps
        # (the session-and-seq index), not its whole history, on every poll.
        .filter(seq__gt=session.last_seq - MODEL_LOOKBACK, superseded_at__isnull=True)
        .order_by("-seq")
        .values_list("payload", flat=True)
        .first()
    )
    recorded = str((payload or {}).get("model") or "") if isinstance(payload, dict) else ""
    return recorded or "not recorded"


def agents_overview(scope: Scope = EVERYTHING) -> AgentsOverview:
    """Every agent this deployment runs (RESPAWN_AGENTS and installed packages), with its
    tools and how many live sessions started on each of its versions; and the agents of
    live sessions that it no longer has. One query, whatever the number of agents: live
    sessions by (agent, version), on the status index (finished sessions, the bulk of a
    large table, are not counted)."""
    from ..runtime import discovered

    found = discovered()
    live_rows = (
        visible_sessions(scope)
        .exclude(status__in=FINAL)
        .values_list("agent", "agent_version")
        .annotate(n=Count("id"))
        .order_by()
    )
    live: dict[str, list[tuple[str, int]]] = {}
    for agent, version, n in live_rows:
        live.setdefault(agent, []).append((version, n))
    views = []
    for agent in agent_registry():
        if not scope.allows(agent.name):
            continue
        described = runner_description(agent)
        instructions = agent.instructions
        if not isinstance(instructions, str):
            instructions = (
                "computed from the session state before every model call by "
                f"{getattr(instructions, '__module__', '?')}."
                f"{getattr(instructions, '__qualname__', repr(instructions))}"
            )
        versions = sorted(live.get(agent.name, []), key=lambda vn: version_key(vn[0]), reverse=True)
        tools = [_tool_view(t) for t in agent.tools]
        kind, model, nodes = "Respawn's loop", agent.model, []
        if agent.runner is not None:
            kind = described.kind if described else f"runner {type(agent.runner).__name__}"
            model = (described.model if described else "") or f"chosen by its {kind}"
            instructions = described.instructions if described else ""
            tools = [_runner_tool_view(t) for t in described.tools] if described else []
            nodes = list(described.nodes) if described else []
        views.append(
            AgentView(
                name=agent.name,
                version=agent.version,
                description=agent.description,
                kind=kind,
                model=model,
                instructions=instructions,
                source=found.sources.get(agent.name, ""),
                limits=agent.limits if agent.runner is None else None,
                state_version=agent.state.version if agent.state else None,
                state_upgraders=sorted(agent.state.upgraders) if agent.state else [],
                compatible_since=agent.compatible_since,
                tools=tools,
                live=versions,
                live_total=sum(n for _, n in versions),
                nodes=nodes,
            )
        )
    names = set(agent_registry().names())
    programs = set(program_agents())
    missing = sorted(
        (agent, sum(n for _, n in rows))
        for agent, rows in live.items()
        if agent not in names and agent not in programs
    )
    by_program = sorted(
        (agent, PROGRAM_AGENTS[agent], sum(n for _, n in rows))
        for agent, rows in live.items()
        if agent in programs
    )
    return AgentsOverview(agents=views, missing=missing, by_program=by_program)


# --- Needs attention --------------------------------------------------------------------


@dataclass(frozen=True)
class RepeatedFailure:
    session: AgentSession
    error: str
    times: int


def repeated_failures(
    limit: int = 50, threshold: int = 2, scope: Scope = EVERYTHING
) -> list[RepeatedFailure]:
    """Failed sessions whose latest error happened at least `threshold` times."""
    failed = list(
        visible_sessions(scope).filter(status=Status.FAILED).order_by("-updated_at")[:500]
    )
    if not failed:
        return []
    error_key = payload_key(PayloadField.ERROR)
    errors = (
        Step.objects.filter(session__in=failed, kind="error", superseded_at__isnull=True)
        .values("session_id", error_key)
        .annotate(n=Count("id"))
        .filter(n__gte=threshold)
        .order_by()
    )
    by_id = {s.id: s for s in failed}
    out = [
        RepeatedFailure(by_id[row["session_id"]], str(row[error_key]), row["n"])
        for row in errors
        if row["session_id"] in by_id
    ]
    out.sort(key=lambda r: r.session.updated_at, reverse=True)
    return out[:limit]


def uncertain_call(session: AgentSession, state: dict[str, Any]) -> dict[str, Any] | None:
    """The tool call a crash left uncertain, as its `uncertain_call` step recorded it."""
    uncertain = state.get("uncertain_calls") or []
    if not session.can_decide() or not uncertain:
        return None
    step = (
        Step.objects.filter(
            payload_q(PayloadField.EVENT, value=SystemEvent.UNCERTAIN_CALL),
            payload_q(PayloadField.CALL_ID, value=uncertain[0]),
            session=session,
            kind="system",
            superseded_at__isnull=True,
        )
        .order_by("-seq")
        .first()
    )
    if step is None:
        return stored(SystemPayload(call_id=uncertain[0]))
    return {**step.payload, "seq": step.seq}


def old_schema_sessions(cap: int = 1000, scope: Scope = EVERYTHING) -> tuple[int, bool]:
    """How many live sessions still have their head checkpoint in an older schema version
    (counted up to `cap`): `upgrade_state` rewrites them ahead of time."""
    rows = list(
        Checkpoint.objects.filter(
            scope.q("session__agent"),
            session__status__in=LOADABLE,
            seq=F("session__head"),
            schema_version__lt=SCHEMA_VERSION,
        )
        .values_list("session_id", flat=True)
        .distinct()[: cap + 1]
    )
    return min(len(rows), cap), len(rows) > cap


def activity_last_24h(scope: Scope = EVERYTHING) -> list[dict[str, Any]]:
    """Sessions started and finished per hour over the last 24 hours."""
    now = timezone.now()
    start = (now - timedelta(hours=23)).replace(minute=0, second=0, microsecond=0)
    started = dict(
        visible_sessions(scope)
        .filter(created_at__gte=start)
        .annotate(hour=TruncHour("created_at"))
        .values("hour")
        .annotate(n=Count("id"))
        .values_list("hour", "n")
    )
    finished = dict(
        visible_sessions(scope)
        .filter(updated_at__gte=start, status__in=FINAL)
        .annotate(hour=TruncHour("updated_at"))
        .values("hour")
        .annotate(n=Count("id"))
        .values_list("hour", "n")
    )
    hours = []
    for i in range(24):
        hour = start + timedelta(hours=i)
        hours.append(
            {"hour": hour, "started": started.get(hour, 0), "finished": finished.get(hour, 0)}
        )
    return hours


ATTENTION_PAGE = 20
ATTENTION_CAP = 1000
FAILED_RECENT_DAYS = 7


@dataclass(frozen=True)
class Waiting:
    """One "needs attention" item and how long it has waited (since its last activity)
    against its section's target."""

    key: str
    session: AgentSession
    waited: timedelta
    target: float  # seconds

    @property
    def past_target(self) -> bool:
        return self.waited.total_seconds() > self.target

    @property
    def over(self) -> timedelta:
        """How far past the target it is (zero when it is not)."""
        return max(self.waited - timedelta(seconds=self.target), timedelta(0))


# The default target per section, in seconds: how long an item may wait for a person
# before it is past target (the page highlights it; the alert rules can alert on it).
# RESPAWN_ATTENTION_TARGETS overrides any of them.
ATTENTION_TARGETS: dict[str, float] = {
    "stuck": 15 * 60,
    "uncertain": 60 * 60,
    "approvals": 4 * 3600,
    "incompatible": 24 * 3600,
    "budget": 4 * 3600,
    "failed": 24 * 3600,
    "failed_calls": 24 * 3600,
    "late_calls": 24 * 3600,
}


def parse_attention_targets(value: Any) -> dict[str, float]:
    """The targets per section: the defaults, with RESPAWN_ATTENTION_TARGETS's (a JSON
    object of section: seconds) over them. ValueError naming what is wrong."""
    if isinstance(value, str):
        import json

        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError(
            f"expected a JSON object of section: seconds, got {type(value).__name__}"
            ' (e.g. {"stuck": 600, "approvals": 7200})'
        )
    targets = dict(ATTENTION_TARGETS)
    for key, seconds in value.items():
        if key not in ATTENTION_TARGETS:
            known = ", ".join(ATTENTION_TARGETS)
            raise ValueError(f"unknown section {str(key)[:80]!r} (one of {known})")
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not math.isfinite(seconds)
            or seconds <= 0
            or seconds > 10 * 365 * 86400
        ):
            raise ValueError(
                f"{key}: expected a number of seconds above 0 (at most ten years), "
                f"got {seconds!r:.80}"
            )
        targets[key] = float(seconds)
    return targets


def attention_targets() -> dict[str, float]:
    """The target of each "needs attention" section, in seconds (checked at start by
    sessions_app.checks, so a bad setting never gets this far)."""
    return parse_attention_targets(settings.RESPAWN_ATTENTION_TARGETS)


@dataclass
class AttentionSection:
    """One group of "needs attention": its sessions a page at a time (oldest activity
    first: waiting longest), how many there are (counted up to ATTENTION_CAP), and how
    they split by agent or by error."""

    key: str
    title: str
    remedy: str
    rows: list[AgentSession]
    count: int
    capped: bool
    groups: list[tuple[str, int]]
    group_by: str
    next_cursor: str | None = None
    cursor: str | None = None
    # How long an item of this section may wait (seconds, RESPAWN_ATTENTION_TARGETS), and
    # how long each row has waited, with whether it is past that target, row by row.
    target: float = 0.0
    waits: list[Waiting] = field(default_factory=list)

    @property
    def count_label(self) -> str:
        return f"{self.count:,}+" if self.capped else f"{self.count:,}"

    @property
    def short(self) -> str:
        return self.title.split(":")[0].split(" (")[0]


def _attention_querysets(now: datetime) -> dict[str, QuerySet[AgentSession]]:
    # The state is json (not jsonb) on PostgreSQL, which has no `?` operator:
    # state__uncertain_calls__0__isnull would compile to it.
    uncertain = (
        Checkpoint.objects.alias(first_uncertain=KT("state__uncertain_calls__0"))
        .filter(
            session__status=Status.WAITING_INPUT,
            seq=F("session__head"),
            first_uncertain__isnull=False,
        )
        .values("session_id")
    )
    cutoff = now - timedelta(seconds=settings.RESPAWN_APPROVAL_SLA)
    recent = now - timedelta(days=FAILED_RECENT_DAYS)
    # A program's own LangGraph thread waits for its program's next call, at an interrupt
    # or not: only a tool call that waits for a person's approval makes it one.
    asked = (
        Checkpoint.objects.alias(approval=KT("state__pending_approval__call_id"))
        .filter(
            session__agent__in=program_agents(),
            seq=F("session__head"),
            approval__isnull=False,
        )
        .values("session_id")
    )
    return {
        "stuck": AgentSession.objects.filter(AgentSession.stuck_q(now)),
        "uncertain": AgentSession.objects.filter(id__in=uncertain),
        "approvals": AgentSession.objects.filter(status=Status.WAITING_INPUT, updated_at__lt=cutoff)
        .exclude(id__in=uncertain)
        .exclude(Q(agent__in=program_agents()) & ~Q(id__in=asked)),
        "incompatible": incompatible_sessions(),
        "budget": AgentSession.objects.filter(AgentSession.paused_by_budget_q()),
        "failed": AgentSession.objects.filter(status=Status.FAILED, updated_at__gte=recent),
        "failed_calls": AgentSession.objects.filter(
            status=Status.COMPLETED, failed_calls__gt=0, updated_at__gte=recent
        ),
        "late_calls": AgentSession.objects.filter(
            id__in=AuditEvent.objects.filter(
                action=LATE_CALL_ACTION, created_at__gte=recent
            ).values("session_id")
        ),
    }


ATTENTION_SECTIONS = {
    # key: (title, remedy, group by)
    "stuck": (
        "Stuck: should be running, no live lease",
        "The reconciler in each worker dispatches these again by itself; dispatch one by hand "
        "if it does not.",
        "agent",
    ),
    "uncertain": (
        "Uncertain side effects: a person must decide",
        "Open each: run the call again, record its result, or fail the session.",
        "agent",
    ),
    "approvals": (
        "Approvals waiting too long",
        "Open each to approve or reject the pending tool call.",
        "agent",
    ),
    "incompatible": (
        "Incompatible: no worker can load them",
        "Deploy code that can load them, then try again.",
        "agent",
    ),
    "budget": (
        "Paused by a budget: steps, tokens, cost or wall time used up",
        "Open each: raise the budget that was reached and resume, or cancel it.",
        "agent",
    ),
    "failed": (
        f"Failed in the last {FAILED_RECENT_DAYS} days",
        "Inspect the failed step, correct it or add an instruction, and resume.",
        "last_error",
    ),
    "failed_calls": (
        f"Completed with failed tool calls (last {FAILED_RECENT_DAYS} days)",
        "They finished, but some tool calls failed, on the tool or on the infrastructure "
        "(the database, Redis, the network) after every retry: their effects may be missing. "
        "Read the failed calls; correct a result or add an instruction and resume.",
        "agent",
    ),
    "late_calls": (
        f"Late calls: a fenced-off worker started a call (last {FAILED_RECENT_DAYS} days)",
        "A worker that had lost the session (frozen past its lease, or overruled by a person) "
        "had started a call that is not idempotent. Its audit record says whether its effect "
        "was refused or may have happened outside the trace: check it was not done twice.",
        "agent",
    ),
}


def attention_section(
    key: str,
    *,
    cursor: str | None = None,
    now: datetime | None = None,
    owner: Q | None = None,
    scope: Scope = EVERYTHING,
) -> AttentionSection:
    """One section of "needs attention", a page after `cursor` (BadFilter if it is bad),
    of the sessions in `scope` that `owner` (selectors.owner_q) matches when given."""
    now = now or database_clock()
    title, remedy, group_by = ATTENTION_SECTIONS[key]
    sessions = _attention_querysets(now)[key].filter(scope.q())
    if owner is not None:
        sessions = sessions.filter(owner)
    if key == "approvals":
        title += f" (over {format_duration(settings.RESPAWN_APPROVAL_SLA)})"
    count = sessions.values("id")[: ATTENTION_CAP + 1].count()
    # How they split, over the sessions counted (a GROUP BY over every stuck or waiting
    # session of a large deployment took 100 ms a section).
    counted = AgentSession.objects.filter(id__in=sessions.order_by().values("id")[:ATTENTION_CAP])
    groups = [
        (str(row[group_by] or "(no message)"), row["n"])
        for row in counted.values(group_by).annotate(n=Count("id")).order_by("-n", group_by)[:8]
    ]
    order = SessionFilters(sort="updated")
    page = sessions
    if cursor:
        page = page.filter(_beyond(order, cursor, forward=True))
    page = with_busy_workers(page, now).select_related("owner")
    rows, more = first_rows(page.order_by("updated_at", "id"), ATTENTION_PAGE)
    target = attention_targets()[key]
    return AttentionSection(
        key=key,
        title=title,
        remedy=remedy,
        rows=rows,
        count=min(count, ATTENTION_CAP),
        capped=count > ATTENTION_CAP,
        groups=groups,
        group_by=group_by,
        next_cursor=encode_cursor(rows[-1], "updated") if more and rows else None,
        cursor=cursor,
        target=target,
        waits=[Waiting(key, s, max(now - s.updated_at, timedelta(0)), target) for s in rows],
    )


PAST_TARGET_LIMIT = 100


def past_target_q(now: datetime) -> Q:
    """Sessions in any "needs attention" section that have waited past its target (what
    the alert rules' "past its target" reason alerts on, and resolves once it is not)."""
    targets = attention_targets()
    late = Q(pk__in=[])
    for key, sessions in _attention_querysets(now).items():
        since = now - timedelta(seconds=targets[key])
        late |= Q(id__in=sessions.filter(updated_at__lt=since).values("id"))
    return late


def past_target(now: datetime | None = None, *, limit: int = PAST_TARGET_LIMIT) -> list[Waiting]:
    """The "needs attention" items waiting past their section's target (what the alert
    rules alert on): up to `limit` per section, the longest waiting first, each with its
    section, how long it has waited and its owner (select_related: no query per row). A
    session in two sections is in both."""
    now = now or database_clock()
    targets = attention_targets()
    found: list[Waiting] = []
    for key, sessions in _attention_querysets(now).items():
        target = targets[key]
        late = sessions.filter(updated_at__lt=now - timedelta(seconds=target))
        for session in late.select_related("owner").order_by("updated_at", "id")[:limit]:
            found.append(Waiting(key, session, now - session.updated_at, target))
    return found


# --- Previews ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RerunCall:
    seq: int | None
    name: str
    call_id: str
    idempotent: bool | None
    needs_approval: bool


@dataclass
class Preview:
    action: str
    checkpoint_seq: int
    superseded: list[Step] = field(default_factory=list)
    superseded_count: int = 0
    reruns: list[RerunCall] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    last_seq: int = 0  # the last step a rollback supersedes

    @property
    def non_idempotent(self) -> int:
        return sum(1 for call in self.reruns if call.idempotent is False)


def _tool_flags(agent: str, name: str) -> tuple[bool | None, bool]:
    try:
        tools = agent_registry().get(agent).tools
    except KeyError:
        return None, False
    # Agent.__post_init__ makes its tools a registry.
    assert isinstance(tools, ToolRegistry)
    tool = tools.get(name)
    if tool is None:
        return None, False
    return tool.idempotent, tool.needs_approval


def preview_resume(session: AgentSession) -> Preview:
    """What a resume will do, decided by the engine's own reading of the trace
    (agent_runtime.loop.next_action over the tail a worker loads), so the preview and the
    worker cannot disagree."""
    from agent_runtime.loop import Finished, RunTools, next_action

    preview = Preview(action=AuditAction.RESUME, checkpoint_seq=session.head)
    after = Step.objects.filter(session=session, seq__gt=session.head, superseded_at__isnull=True)
    count = after.count()
    if count:
        preview.notes.append(
            f"{count} step(s) after checkpoint {session.head} are kept and folded into the state; "
            "nothing before the checkpoint runs again."
        )
    try:
        head = session_store().load_tail(str(session.id))
    except IncompatibleSchemaError as exc:
        preview.notes.append(f"This code cannot load the session; a worker will refuse it: {exc}")
        return preview
    action = next_action(head.history)
    if isinstance(action, RunTools):
        for pending in action.calls:
            call = pending.call
            idempotent, approval = _tool_flags(session.agent, call.name)
            recorded = pending.tool_call_step
            preview.reruns.append(
                RerunCall(
                    recorded.seq if recorded else None, call.name, call.id, idempotent, approval
                )
            )
            if recorded is not None:
                preview.notes.append(
                    f"Tool call #{recorded.seq} ({call.name}) was recorded but has no result: "
                    + (
                        "it runs again with the same idempotency key."
                        if idempotent is not False
                        else "it is NOT idempotent, so the session waits for a person to say "
                        "whether it happened."
                    )
                )
            elif approval and pending.decision is None:
                preview.notes.append(f"{call.name} needs approval: the session waits for it.")
    elif isinstance(action, Finished):
        preview.notes.append("The turn is answered already: the run only settles the status.")
    else:
        preview.notes.append("The model is called next, with the history as it stands.")
    if session.paused_by_budget:
        reached = [b for b in session_budgets(session) if b.reached]
        if reached:
            names = ", ".join(b.name for b in reached)
            preview.notes.append(
                f"The {names} budget is still used up: raise it first, or the session pauses "
                "again at once."
            )
    return preview


def preview_rollback(session: AgentSession, checkpoint_seq: int) -> Preview:
    preview = Preview(action=AuditAction.ROLLBACK, checkpoint_seq=checkpoint_seq)
    later = Step.objects.filter(session=session, seq__gt=checkpoint_seq, superseded_at__isnull=True)
    preview.superseded_count = later.count()
    preview.superseded = list(later.order_by("seq")[:50])
    preview.last_seq = session.last_seq
    done_calls = [s for s in later.filter(kind="tool_call").order_by("seq")[:200]]
    for step in done_calls:
        call = as_tool_call(step.payload)
        idempotent, approval = _tool_flags(session.agent, call.get("name", ""))
        preview.reruns.append(
            RerunCall(step.seq, call.get("name", ""), call.get("call_id", ""), idempotent, approval)
        )
    if preview.reruns:
        preview.notes.append(
            "These tool calls already ran and are rolled back in the trace only: their side "
            "effects stay. If the model asks for them again after a resume, they run again "
            "with new keys."
        )
    preview.notes.append("The session is paused afterwards; nothing runs until someone resumes it.")
    return preview


def checkpoints_of(session: AgentSession) -> list[Checkpoint]:
    return list(Checkpoint.objects.filter(session=session).order_by("seq", "id").defer("state"))


def latest_checkpoints(session: AgentSession, limit: int = 20) -> tuple[list[Checkpoint], bool]:
    """The latest `limit` checkpoints (oldest first), and whether there are older ones: a
    long session checkpoints every turn, and its page lists only the recent ones. The
    head is always among them, however old (a rollback to an early checkpoint leaves the
    latest ones superseded); each says whether a rollback superseded it."""
    checkpoints = Checkpoint.objects.filter(session=session).annotate(
        # Its step was superseded by a rollback: no longer on the session's path (and
        # shown in the trace only with the superseded steps).
        superseded=Exists(
            Step.objects.filter(session=session, seq=OuterRef("seq"), superseded_at__isnull=False)
        )
    )
    rows = list(checkpoints.order_by("-seq", "-id").defer("state")[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    if session.head and not any(row.seq == session.head for row in rows):
        head = checkpoints.filter(seq=session.head).order_by("-id").defer("state").first()
        if head is not None:
            rows = [*rows[: limit - 1], head]
    return sorted(rows, key=lambda row: (row.seq, row.pk)), more


def head_state(session: AgentSession) -> dict[str, Any]:
    """The head checkpoint's state, upgraded to the current schema (as stored if it cannot
    be: the page then shows the session's incompatibility)."""
    return head(session)[1]


def head(session: AgentSession) -> tuple[Checkpoint | None, dict[str, Any]]:
    """The head checkpoint (None before the first), and its state as head_state reads it."""
    checkpoint = session.head_checkpoint()
    return checkpoint, upgraded_state(checkpoint.state) if checkpoint else {}


# --- Budgets and costs ----------------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    name: str  # steps | tokens | cost | time
    limit: Any  # None: no limit
    used: Any
    reached: bool

    @property
    def percent(self) -> int | None:
        if self.limit in (None, 0) or not isinstance(self.limit, int | float):
            return None
        return min(100, int(float(self.used) * 100 / float(self.limit)))


def session_budgets(session: AgentSession, state: dict[str, Any] | None = None) -> list[Budget]:
    """The session's budgets as its next run will see them (the head checkpoint's, with
    the set_budgets steps written after it) beside what it has used. The same four for
    every kind of agent; a foreign runner's session (a LangGraph graph, an SDK agent) has
    no default limit, since Respawn's loop does not run it."""
    state = head_state(session) if state is None else state
    try:
        limits = asdict(SessionState.from_dict(state).budgets) if state else {}
    except StateError:
        # A state this code cannot read (the page says why) has no limits a run applies.
        limits = {}
    registry = agent_registry()
    agent = registry.get(session.agent) if session.agent in registry else None
    if (agent is not None and agent.runner is not None) or session.agent in program_agents():
        # A LangGraph graph or an SDK agent runs its own turn loop: no limit of Respawn's
        # stops it (its checkpoints carry the engine's default budgets, never applied), so
        # its budgets read as the built-in loop's do when nothing limits them.
        limits = {}
    elif not limits and agent is not None:  # no checkpoint yet: the agent's limits
        limits = {k: getattr(agent.limits, k) for k in STATE_BUDGETS}
    # The steps fold in by the engine's own rule, on a state holding just these budgets (a
    # limit nothing set stays None: no limit).
    start: dict[str, Any] = {k: limits.get(k) for k in STATE_BUDGETS}
    folded = SessionState(session.agent, session.agent_version, budgets=Budgets(**start))
    for payload in (
        Step.objects.filter(
            payload_q(PayloadField.ACTION, value=OperatorAction.SET_BUDGETS),
            session=session,
            seq__gt=session.head,
            kind="operator",
            superseded_at__isnull=True,
        )
        .order_by("seq")
        .values_list("payload", flat=True)
    ):
        apply_budgets(folded, payload)
    limits = asdict(folded.budgets)
    tokens = session.tokens_in + session.tokens_out
    cost = float(session.cost)
    now = timezone.now()
    deadline = session.deadline_at
    out = [
        Budget("steps", limits.get("max_steps"), session.step_count, False),
        Budget("tokens", limits.get("max_tokens"), tokens, False),
        Budget("cost", limits.get("max_cost"), round(cost, 6), False),
        Budget(
            "time",
            None if deadline is None else (deadline - session.created_at).total_seconds(),
            round((min(now, deadline or now) - session.created_at).total_seconds()),
            False,
        ),
    ]
    return [
        Budget(b.name, b.limit, b.used, b.limit is not None and float(b.used) >= float(b.limit))
        for b in out
    ]


USAGE_GROUPS = {"day": "day", "agent": "agent", "model": "model"}
USAGE_FIELDS = (
    "calls",
    "tokens_in",
    "tokens_out",
    "cache_read_tokens",
    "cache_write_tokens",
    "cost",
    "unpriced_calls",
)


def usage_totals(
    *,
    group: str = "day",
    since: date | None = None,
    until: date | None = None,
    agent: str | None = None,
    scope: Scope = EVERYTHING,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """What model calls used and cost, summed by day, agent or model (rows, newest day or
    largest cost first) and in all, between two days (inclusive), for the agents of
    `scope`."""
    if group not in USAGE_GROUPS:
        raise BadFilter(f"group must be one of {', '.join(USAGE_GROUPS)}, got {group!r}")
    rows = ModelUsage.objects.filter(scope.q())
    if since is not None:
        rows = rows.filter(day__gte=since)
    if until is not None:
        rows = rows.filter(day__lte=until)
    if agent:
        rows = rows.filter(agent=agent)
    sums = {name: Sum(name) for name in USAGE_FIELDS}
    grouped = rows.values(USAGE_GROUPS[group]).annotate(**sums)
    grouped = grouped.order_by("-day") if group == "day" else grouped.order_by("-cost", group)
    total = rows.aggregate(**sums)

    def clean(row: dict[str, Any]) -> dict[str, Any]:
        out = {name: row.get(name) or 0 for name in USAGE_FIELDS}
        out["cost"] = float(out["cost"])
        return out

    return (
        [{"key": str(row[group]), **clean(row)} for row in grouped],
        clean(total),
    )


def upgraded_state(blob: Any) -> dict[str, Any]:
    from agent_runtime.upgraders import upgrade_state_blob

    try:
        return upgrade_state_blob(blob).value
    except IncompatibleSchemaError:
        return blob if isinstance(blob, dict) else {}


# --- Schema versions: incompatible sessions and the deploy gate -----------------------


def incompatible_sessions() -> QuerySet[AgentSession]:
    """Sessions no worker could load, newest first, each with `incompatible_reason`
    (and `incompatible_at`, and the schema version of the code that refused it). For the
    dashboard's "needs attention" view; served by the session_incompatible index."""
    return AgentSession.objects.filter(incompatible_at__isnull=False).order_by(
        "-incompatible_at", "id"
    )


@dataclass(frozen=True)
class CompatFailure:
    session_id: str
    agent: str
    status: str
    where: str  # "checkpoint at seq 7", "step seq 12 (model)"
    error: str
    incompatible_since: datetime | None = None


@dataclass
class CompatReport:
    schema_version: int
    checked: int = 0
    failures: list[CompatFailure] = field(default_factory=list)
    # newest schema version among the blobs a run loads -> how many sessions
    sessions_per_version: dict[int, int] = field(default_factory=dict)
    # marked incompatible earlier, but this code loads them
    loads_now: list[str] = field(default_factory=list)
    # (agent, the version each session started on) -> how many sessions
    sessions_per_agent_version: dict[tuple[str, str], int] = field(default_factory=dict)
    # Sessions a program runs itself (RespawnSaver or RespawnSession under the default
    # agent name, no agent of that name here): agent -> how many; not checked, no failure.
    by_program: dict[str, int] = field(default_factory=dict)

    @property
    def failing_sessions(self) -> int:
        return len({f.session_id for f in self.failures})


def program_agents() -> list[str]:
    """Agent names of sessions their own program runs, not the workers: the names
    RespawnSaver and RespawnSession give when told none, unless this deployment registers
    an agent of that name."""
    return sorted(name for name in PROGRAM_AGENTS if AgentSession(agent=name).run_by_program())


def _has_column(model: type[AgentSession], column: str) -> bool:
    with connection.cursor() as cursor:
        description = connection.introspection.get_table_description(cursor, model._meta.db_table)
    return column in {c.name for c in description}


def state_compat_report(*, every_session: bool = False) -> CompatReport:
    """Load every session a worker may still run, exactly as a worker loads it (the head
    checkpoint and the live history, through the upgraders), with this code, and check it
    against the agents this code has (agent_runtime.compat): the agent exists, its version
    continues the session, its own state loads, and every tool call still to run names a
    tool that exists and takes the stored arguments (an agent run by a foreign runner is
    checked by its runner: a LangGraph graph's nodes, an SDK agent's tools). Sessions their
    own program runs (`program_agents`) are counted in `by_program`, never failures.

    Reads only columns that exist before this release's migrations: the deploy gate runs
    with the new code against the old schema."""
    sessions = AgentSession.objects.all()
    if not every_session:
        sessions = sessions.filter(status__in=LOADABLE)
    rows = list(sessions.order_by("created_at", "id").values_list("id", "agent", "status"))
    marked: dict[Any, datetime | None] = {}
    if _has_column(AgentSession, "incompatible_at"):
        marked = dict(
            AgentSession.objects.filter(
                id__in=sessions.values("id"), incompatible_at__isnull=False
            ).values_list("id", "incompatible_at")
        )
    by_program = set(program_agents())
    report = CompatReport(schema_version=SCHEMA_VERSION)
    store = session_store()
    registry = agent_registry()
    for session_id, agent, status in rows:
        if agent in by_program:
            report.by_program[agent] = report.by_program.get(agent, 0) + 1
            continue
        report.checked += 1
        try:
            head = store.load_head(str(session_id))
        except IncompatibleSchemaError as exc:
            report.failures.append(
                CompatFailure(
                    session_id=str(session_id),
                    agent=agent,
                    status=status,
                    where=exc.where or "session",
                    error=exc.detail,
                    incompatible_since=marked.get(session_id),
                )
            )
        else:
            problems = session_problems(head, registry)
            report.failures.extend(
                CompatFailure(
                    session_id=str(session_id),
                    agent=agent,
                    status=status,
                    where=problem.where,
                    error=problem.error,
                    incompatible_since=marked.get(session_id),
                )
                for problem in problems
            )
            if not problems and session_id in marked:
                report.loads_now.append(str(session_id))
    report.sessions_per_version = _sessions_per_version(sessions)
    if _has_column(AgentSession, "agent_version"):
        report.sessions_per_agent_version = {
            (agent, version): count
            for agent, version, count in sessions.order_by()
            .values_list("agent", "agent_version")
            .annotate(count=Count("id"))
            .order_by("agent", "agent_version")
        }
    return report


def _sessions_per_version(sessions: QuerySet[AgentSession]) -> dict[int, int]:
    """Each session counted once, under the newest version among its head checkpoint and
    live steps (the version of the code that last wrote to it)."""
    ids = sessions.values("id")
    newest: dict[Any, int] = dict(
        Step.objects.filter(session_id__in=ids, superseded_at__isnull=True)
        .values_list("session_id")
        .annotate(version=Max("schema_version"))
    )
    heads = (
        Checkpoint.objects.filter(session_id__in=ids, seq=F("session__head"))
        .values_list("session_id")
        .annotate(version=Max("schema_version"))
    )
    for session_id, version in heads:
        newest[session_id] = max(version, newest.get(session_id, 0))
    counts: dict[int, int] = {}
    for version in newest.values():
        counts[version] = counts.get(version, 0) + 1
    return dict(sorted(counts.items()))


# --- What the faces read (dashboard, API, admin) ---------------------------------------


def session_by_id(session_id: Any, scope: Scope = EVERYTHING) -> AgentSession | None:
    """The session, with its parent (which a page names) and owner, and whether people
    left notes on it (`has_notes`: the trace's margin reads them only then), or None
    (also when it is outside `scope`: a session someone may not see does not exist for
    them)."""
    return (
        visible_sessions(scope)
        .select_related("parent", "owner")
        .annotate(has_notes=Exists(SessionNote.objects.filter(session=OuterRef("pk"))))
        .filter(id=session_id)
        .first()
    )


NOTES_SHOWN = 500  # notes the margin of one page of the trace shows at most


def trace_notes(session: AgentSession, *, after: int, upto: int | None) -> list[SessionNote]:
    """The session's notes written at steps after `after` (every one when it is 0) up
    to `upto` (None: to the end), in trace order, with their authors: what the margin of a
    page of the trace shows."""
    notes = SessionNote.objects.filter(session=session)
    if after > 0:
        notes = notes.filter(seq__gt=after)
    if upto is not None:
        notes = notes.filter(seq__lte=upto)
    return list(notes.order_by("seq", "id")[:NOTES_SHOWN])


def note_count(session: AgentSession) -> int:
    return SessionNote.objects.filter(session=session).count()


OPERATORS_CACHE_SECONDS = 30


def operator_names(agent: str) -> list[str]:
    """Whom a session of `agent` may be handed to, as the forms suggest it: the active users
    who may act on that agent's sessions (global operators and admins, and the operators and
    team admins of the team that owns it; permissions.operators_of_agent_q). Cached for
    OPERATORS_CACHE_SECONDS per agent; the service checks the one named."""
    from hashlib import sha256

    from django.contrib.auth import get_user_model
    from django.core.cache import cache

    from ..permissions import operators_of_agent_q

    # Hashed: an agent's name may hold what a cache key may not (spaces, length).
    key = "respawn:operator-names:" + sha256(agent.encode()).hexdigest()[:32]
    names = cache.get(key)
    if names is None:
        users = get_user_model().objects.filter(operators_of_agent_q(agent))
        names = list(users.order_by("username").values_list("username", flat=True).distinct()[:500])
        cache.set(key, names, OPERATORS_CACHE_SECONDS)
    return list(names)


def sessions_by_ids(ids: list[uuid.UUID], scope: Scope = EVERYTHING) -> list[AgentSession]:
    """The sessions of a bulk selection in `scope`, latest activity first."""
    sessions = visible_sessions(scope).filter(id__in=ids)
    return list(with_busy_workers(sessions).order_by("-updated_at"))


def matching_count(f: SessionFilters) -> int:
    """How many sessions the list's filters match (what a bulk action on all of them
    names before it is taken): an exact count."""
    return filtered_sessions(f).count()


def matching_sessions(
    f: SessionFilters, *, after: uuid.UUID | None, size: int
) -> tuple[list[AgentSession], uuid.UUID | None]:
    """The next `size` sessions the filters match, in id order after `after` (a keyset
    over the primary key: stable while the actions change the rows' status and time), and
    the `after` of the rest (None: these are the last)."""
    sessions = filtered_sessions(f)
    if after is not None:
        sessions = sessions.filter(id__gt=after)
    rows, more = first_rows(with_busy_workers(sessions).order_by("id"), size)
    return rows, rows[-1].id if more and rows else None


def api_session_page(
    *,
    status: str | None,
    agent: str | None,
    agent_version: str | None,
    cursor: str | None,
    size: int,
    owner: Q | None = None,
    scope: Scope = EVERYTHING,
) -> tuple[list[AgentSession], str | None]:
    """The API's list: latest activity first, a keyset page after `cursor` (BadFilter if
    it is not one this list gave), and the cursor of the next page. An agent version of
    "" is a filter too: the sessions that started before versions were recorded. `owner`
    (api_owner_q): whose sessions; None: anyone's."""
    sessions = visible_sessions(scope).select_related("owner")
    if owner is not None:
        sessions = sessions.filter(owner)
    if status is not None:
        sessions = sessions.filter(status=status)
    if agent:
        sessions = sessions.filter(agent=agent)
    if agent_version is not None:
        sessions = sessions.filter(agent_version=agent_version)
    order = SessionFilters()
    if cursor:
        sessions = sessions.filter(_beyond(order, cursor, forward=True))
    sessions = with_busy_workers(sessions)
    rows, more = first_rows(sessions.order_by(*SORTS[order.sort]), size)
    return rows, encode_cursor(rows[-1], order.sort) if more and rows else None


def steps_page(
    session: AgentSession, *, after: int, size: int, include_superseded: bool = True
) -> tuple[list[Step], int | None]:
    """The session's steps after seq `after`, in order, and the `after` of the next page."""
    steps = Step.objects.filter(session=session, seq__gt=after).order_by("seq")
    if not include_superseded:
        steps = steps.filter(superseded_at__isnull=True)
    rows, more = first_rows(steps, size)
    return rows, rows[-1].seq if more and rows else None


def superseded_count(session: AgentSession) -> int:
    """Steps a rollback superseded (the trace's toggle; a partial index keeps it cheap)."""
    return Step.objects.filter(session=session, superseded_at__isnull=False).count()


def live_tool_results(session: AgentSession, limit: int = 50) -> list[tuple[int, str, Any]]:
    """(seq, tool, output) of the latest live tool results: what an operator may correct,
    and what each says now (the key `output` is the same at every schema version)."""
    return list(
        Step.objects.filter(session=session, kind=Kind.TOOL_RESULT, superseded_at__isnull=True)
        .order_by("-seq")
        .values_list("seq", payload_key(PayloadField.NAME), payload_key(PayloadField.OUTPUT))[
            :limit
        ]
    )


def steps_between(session: AgentSession, first: int, second: int) -> int:
    """How many steps lie after the earlier seq, up to the later one (a diff's span)."""
    low, high = min(first, second), max(first, second)
    return Step.objects.filter(session=session, seq__gt=low, seq__lte=high).count()


def checkpoint_by_id(session: AgentSession, checkpoint_id: int) -> Checkpoint | None:
    return Checkpoint.objects.filter(session=session, pk=checkpoint_id).first()


def recent_audit(session: AgentSession, limit: int = 20) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(session=session).order_by("-created_at")[:limit])


def imported_audit(session: AgentSession, limit: int = 50) -> tuple[list[ImportedAuditRecord], int]:
    """The audit history the session's import brought (another deployment's account, kept
    apart from this one's audit trail): the first `limit` records in the file's order, and
    how many there are."""
    records = ImportedAuditRecord.objects.filter(session=session).order_by("position")
    first = list(records[:limit])
    return first, len(first) if len(first) < limit else records.count()


def audit_page(
    *,
    actor: str = "",
    action: str = "",
    session_id: uuid.UUID | None = None,
    session_ids: tuple[uuid.UUID, uuid.UUID] | None = None,
    before: int | None = None,
    size: int,
    scope: Scope = EVERYTHING,
    token_teams: frozenset[int] | None = None,
) -> tuple[list[AuditEvent], bool]:
    """The audit log, newest first, filtered; a page before event id `before`, and
    whether older events follow. `session_ids`: sessions whose ids lie in this range
    (both ends included: the ids a prefix stands for; a range on the session index). A
    reader whose scope is not everything sees the events of their sessions only, and the
    issue and revocation of the API tokens of `token_teams` (the teams they administer)."""
    events = AuditEvent.objects.select_related("session").order_by("-id")
    if not scope.everything:
        seen = scope.q("session__agent")
        if token_teams:
            slugs = list(Team.objects.filter(pk__in=token_teams).values_list("slug", flat=True))
            seen |= Q(
                session__isnull=True,
                action__in=(AuditAction.TEAM_ISSUE_TOKEN, AuditAction.TEAM_REVOKE_TOKEN),
                after__team__in=slugs,
            )
        events = events.filter(seen)
    if actor:
        events = events.filter(actor_label__iexact=actor)
    if action:
        events = events.filter(action=action)
    if session_id is not None:
        events = events.filter(session_id=session_id)
    if session_ids is not None:
        events = events.filter(session_id__gte=session_ids[0], session_id__lte=session_ids[1])
    if before is not None:
        events = events.filter(id__lt=before)
    return first_rows(events, size)


def recent_audit_actions(limit: int) -> set[str]:
    """The actions of the latest `limit` audit events (a bounded read, not DISTINCT over
    the whole log)."""
    latest = AuditEvent.objects.order_by("-created_at").values_list("action", flat=True)
    return set(latest[:limit])


def api_token(raw: str) -> tuple[ApiToken | None, str | None]:
    """What a bearer secret names, for every face that takes one (the API, /metrics):
    (the token, with its user, None) when it may be used; (None, why) for a real token
    that no longer may (revoked, expired, its account disabled): not a guess, and said
    so; (None, None) for no token at all: a wrong credential."""
    found = ApiToken.objects.select_related("user").filter(key_hash=ApiToken.hash(raw)).first()
    if found is None:
        return None, None
    if found.revoked_at is not None:
        return None, f"this API token was revoked at {found.revoked_at.isoformat()}"
    if found.expires_at is not None and found.is_expired:
        return None, f"this API token expired at {found.expires_at.isoformat()}"
    if not found.user.is_active:
        return None, "this API token's account is disabled"
    return found, None
