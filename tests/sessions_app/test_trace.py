"""The trace, timeline and usage reads behind a session's page: runs and why they started,
turns, retries, crashes, failures, the active-time axis, and their query counts on a
5,000-step session."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.urls import reverse

from sessions_app.dashboard import trace
from sessions_app.dashboard.presenters import (
    ActiveAxis,
    RunHeader,
    StepItem,
    TurnHeader,
    attempts_of,
    format_ago,
    format_cost,
    format_count,
    format_ms,
    present_step,
    run_reason,
)
from sessions_app.models import STEP_FAILED, AgentSession, Step
from sessions_app.services.core import session_start

from ..builders import build_long_session
from ..conftest import run_inline

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def long(db):
    return build_long_session(5000, status="failed")


# --- Numbers a person reads -------------------------------------------------------------


def test_durations_read_as_a_person_says_them():
    assert format_ms(0.42) == "0.4 ms"
    assert format_ms(223.4) == "223 ms"
    assert format_ms(1400) == "1.4 s"
    assert format_ms(42_000) == "42 s"
    assert format_ms(72_000) == "1 m 12 s"
    assert format_ms(3 * 3600_000 + 5 * 60_000) == "3 h 5 m"
    assert format_ms(2 * 86400_000 + 4 * 3600_000) == "2 d 4 h"
    assert format_ms(None) == ""


def test_counts_costs_and_relative_times():
    assert format_count(20000) == "20,000" and format_count(7) == "7"
    assert format_cost(0) == "" and format_cost("0.012300") == "0.0123"
    assert format_cost(12.4) == "12.40"
    now = datetime(2026, 1, 2, 12, 0, tzinfo=UTC)
    assert format_ago(now - timedelta(seconds=1), now) == "just now"
    assert format_ago(now - timedelta(seconds=30), now) == "30 s ago"
    assert format_ago(now - timedelta(minutes=5, seconds=10), now) == "5 min ago"
    assert format_ago(now - timedelta(hours=3), now) == "3 h ago"
    assert format_ago(now + timedelta(seconds=8), now) == "in 8 s"
    assert format_ago(now - timedelta(days=90), now) == "2025-10-04"


def test_each_attempt_of_a_retried_call_says_how_it_ended():
    attempts = attempts_of(
        {"status": "ok", "attempts": 3, "attempt_errors": ["503", "reset"], "error": None}
    )
    assert [(a.number, a.ok, a.error) for a in attempts] == [
        (1, False, "503"),
        (2, False, "reset"),
        (3, True, ""),
    ]
    # Results stored before attempt errors were kept still say which attempts failed.
    older = attempts_of({"status": "error", "attempts": 2, "error": "down"})
    assert [(a.ok, a.error) for a in older] == [
        (False, "(this attempt's error was not kept)"),
        (False, "down"),
    ]
    assert attempts_of({"status": "ok", "attempts": 1}) == []


# --- Why a run started ------------------------------------------------------------------


def _step(seq, kind, payload, session=None):
    return Step(session=session, seq=seq, kind=kind, payload=payload)


def test_why_a_run_started_comes_from_the_step_before_it():
    user = _step(1, "user", {"content": []})
    assert run_reason(1, user, None, None).reason == "new"
    # The step before a later run removed by retention: nothing is made up about it.
    assert run_reason(3, None, "w1", "olivia").text == "resumed by olivia"
    call = _step(9, "tool_call", {"call_id": "c", "name": "tick", "arguments": {}})
    crash = run_reason(3, call, "w1", None)
    assert crash.reason == "crash" and crash.crashed_after == 9
    assert crash.text == (
        "resumed after a crash: the run on w1 stopped after #9 (call) without finishing"
    )
    started = _step(4, "system", {"event": "run_started", "worker": "w1"})
    assert "just after it started (#4)" in run_reason(2, started, "w1", "olivia").text
    assert run_reason(2, started, "w1", "olivia").text.startswith("resumed by olivia after a")
    operator = _step(5, "operator", {"action": "instruction", "actor": "olivia"})
    assert run_reason(2, operator, "w1", None).text == "after olivia's instruction"
    error = _step(6, "error", {"where": "model", "error": "529"})
    assert run_reason(2, error, "w1", "olivia").text == "resumed by olivia after the failure at #6"
    answer = _step(7, "model", {"content": [], "tool_calls": []})
    assert run_reason(2, _step(8, "user", {"content": []}), "w1", None).reason == "message"
    assert run_reason(2, answer, "w1", None).reason == "continue"
    finished = _step(8, "system", {"event": "run_finished", "outcome": "waiting_input"})
    assert run_reason(2, finished, "w1", None).reason == "continue"  # a runner's clean end
    joined = _step(8, "system", {"event": "joined", "results": 3})
    assert run_reason(2, joined, "w1", None).text == "after the fan-out joined"
    branch = _step(8, "tool_result", {"status": "ok", "branch": {"index": 1, "of": 3}})
    assert run_reason(2, branch, "w1", None).reason == "branches"


def test_a_page_of_the_trace_is_grouped_by_run_and_turn(long):
    page = trace.trace_page(
        long.session, after=long.crash_call_seq - 4, filters=trace.TraceFilters(), limit=12
    )
    runs = [i for i in page.items if isinstance(i, RunHeader)]
    assert [r.seq for r in runs] == [long.crash_run_seq]
    run = runs[0]
    assert run.number == 2 and run.worker == "w2-host-b" and run.start.reason == "crash"
    assert "the run on w1-host-a stopped after" in run.start.text
    # The step the worker died after is marked where it is.
    crashed = next(
        i for i in page.items if isinstance(i, StepItem) and i.seq == long.crash_call_seq
    )
    assert [m.label for m in crashed.view.marks if m.css == "crash"] == ["worker stopped here"]
    # The page starts inside a turn, and so does the new run: both say "continued".
    turns = [i for i in page.items if isinstance(i, TurnHeader)]
    first_seq = page.views[0].seq
    models_before = Step.objects.filter(
        session=long.session, kind="model", seq__lte=first_seq
    ).count()
    assert turns[0].continued and turns[0].number == models_before
    after_run = page.items[page.items.index(run) + 1]
    assert isinstance(after_run, TurnHeader) and after_run.continued
    # Tool steps are indented under their turn; the run header is not.
    assert all(
        i.view.in_turn
        for i in page.items
        if isinstance(i, StepItem) and i.view.kind in ("tool_call", "tool_result")
    )


def test_resumes_and_operator_steps_explain_their_runs(long):
    filters = trace.TraceFilters()
    after_instruction = trace.trace_page(
        long.session, after=long.instruction_seq - 1, filters=filters, limit=3
    )
    header = next(i for i in after_instruction.items if isinstance(i, RunHeader))
    assert header.start.reason == "operator" and header.start.text == "after olivia's instruction"
    after_error = trace.trace_page(
        long.session, after=long.model_error_seq - 1, filters=filters, limit=3
    )
    header = next(i for i in after_error.items if isinstance(i, RunHeader))
    assert header.worker == "w3-host-c"
    assert header.start.text == f"resumed by olivia after the failure at #{long.model_error_seq}"


def test_pages_loaded_one_after_another_read_as_one(long):
    """Lazy loading passes each page's turn and run counts to the next: the trace read a
    page at a time numbers turns and runs as the whole trace read at once does."""
    filters = trace.TraceFilters()
    whole = trace.trace_page(long.session, after=0, filters=filters, limit=5000)
    paged, after, context = [], 0, None
    while True:
        page = trace.trace_page(long.session, after=after, filters=filters, context=context)
        paged.extend(page.items)
        if not page.more:
            break
        after, context = page.last_seq, page.context

    def shape(items):
        return [
            (type(i).__name__, getattr(i, "seq", None), getattr(i, "number", None))
            for i in items
            if not (isinstance(i, TurnHeader) and i.continued)
        ]

    assert shape(paged) == shape(whole.items)
    # A page opened at any step counts the turns and runs before it itself.
    for start in (3000, 3001, 3002):
        jumped = trace.trace_page(long.session, after=start, filters=filters)
        first_turn = next(i for i in jumped.items if isinstance(i, TurnHeader))
        models = Step.objects.filter(session=long.session, kind="model", seq__lte=start + 1)
        assert first_turn.number == models.count(), start


def test_filters_show_failed_retried_and_kinds(long):
    failed = trace.trace_page(
        long.session, after=0, filters=trace.TraceFilters(status="failed"), limit=100
    )
    assert [v.seq for v in failed.views] == sorted([long.model_error_seq, long.failed_tool_seq])
    assert all(isinstance(i, StepItem) for i in failed.items)  # no grouping when filtered
    retried = trace.trace_page(
        long.session, after=0, filters=trace.TraceFilters(status="retried"), limit=100
    )
    assert [v.seq for v in retried.views] == long.retried_seqs
    view = retried.views[0]
    assert view.status == "retried" and view.status_label == "ok after 3 attempts"
    assert [a.error for a in view.attempts] == [
        "503 Service Unavailable",
        "connection reset by peer",
        "",
    ]
    operators = trace.trace_page(
        long.session, after=0, filters=trace.TraceFilters(kind="operator"), limit=100
    )
    assert [v.seq for v in operators.views] == [long.instruction_seq]
    bad = trace.TraceFilters.from_query({"kind": "nope", "status": "weird"})
    assert bad.kind == "" and bad.status == "" and len(bad.errors) == 2


def test_failures_come_from_the_step_failed_index(long):
    found = trace.failures(long.session)
    assert (found.first, found.last, found.count) == (
        long.model_error_seq,
        long.failed_tool_seq,
        2,
    )
    # The partial index's condition is the filter's: the planner can use it (it may not
    # when a table is this small, so sequential scans are ruled out for the check).
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        sql, params = (
            Step.objects.filter(session=long.session, superseded_at__isnull=True)
            .filter(STEP_FAILED)
            .values("seq")
            .query.sql_with_params()
        )
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "step_failed" in plan, plan


def test_turns_and_runs_before_a_page_are_counted_from_indexes(long):
    """The counts behind a page deep in a session read indexes, not every step before it."""

    def plan(queryset):
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")
            sql, params = queryset.query.sql_with_params()
            cursor.execute("EXPLAIN " + sql, params)
            return "\n".join(row[0] for row in cursor.fetchall())

    before = Step.objects.filter(session=long.session, seq__lte=4000)
    models = plan(before.filter(kind="model").values("seq"))
    assert "Index Only Scan using step_session_kind_seq" in models, models
    runs = plan(
        before.filter(kind="system", payload__event="run_started", superseded_at__isnull=True)
    )
    assert "step_run_started" in runs, runs
    context = trace.trace_context(long.session, 4000, trace.TraceFilters())
    assert context.runs_before == len([s for s in long.run_seqs if s <= 4000])
    assert context.turns_before == before.filter(kind="model").count()
    assert context.worker == "w3-host-c"


def test_the_plan_shown_is_the_latest_one(db):
    session = run_inline(session_start(agent="demo", input="what is (12*7)+3, then save it"))
    plan = trace.current_plan(session, {"plan": []})
    assert [p["label"] for p in plan] == []  # at the head, the head's own plan is used
    AgentSession.objects.filter(id=session.id).update(head=4)
    session.refresh_from_db()
    plan = trace.current_plan(session, {"plan": [{"title": "old", "status": "pending"}]})
    assert [(p["title"], p["label"]) for p in plan] == [
        ("compute (12*7)+3", "done"),
        ("save the result as a note", "in progress"),
        ("answer", "pending"),
    ]


# --- Timeline and usage -----------------------------------------------------------------


def test_active_time_axis_collapses_long_gaps():
    axis = ActiveAxis([(0.0, 1.0), (1.5, 2.0), (3602.0, 3603.0)])
    assert axis.active_seconds == pytest.approx(3.0)
    assert [round(g.seconds) for g in axis.gaps] == [3600]
    assert axis.position(3602.5) == (pytest.approx(2.5), 1)


def test_the_timeline_of_a_long_session(long):
    t = trace.timeline(long.session, trace.TraceFilters())
    assert t.total_steps == Step.objects.filter(session=long.session).count()
    assert t.overview is not None and len(t.bars) == trace.TIMELINE_WINDOW
    assert t.window[1] == long.session.last_seq  # the latest steps, one row each
    labels = [g["label"] for g in t.overview["gaps"]]
    assert any("2 h" in label and "waiting for a person" in label for label in labels)
    assert any("until another worker took over (crash)" in label for label in labels)
    assert any("failed, until resumed" in label for label in labels)
    # Failures are marked in the overview and link to their step.
    marked = sorted(c["first_failed"] for c in t.overview["columns"] if c["failed"])
    assert marked == sorted([long.model_error_seq, long.failed_tool_seq])
    crashes = [r["seq"] for r in t.overview["runs"] if r["crash"]]
    assert crashes == [long.crash_run_seq]
    # A window around the fan-out: the three branches ran at once, side by side.
    zoom = trace.timeline(
        long.session, trace.TraceFilters(), window=(long.fan_out_seq - 5, long.fan_out_seq + 5)
    )
    branches = [b for b in zoom.bars if b["branch"] and b["kind"] == "tool_result"]
    assert len(branches) == 3 and len({b["y"] for b in branches}) == 3
    assert max(b["x"] for b in branches) < min(b["x"] + b["w"] for b in branches)


def test_the_built_session_loads_as_a_worker_would(long):
    from agent_runtime.upgraders import upgrade_state_blob
    from sessions_app.models import Checkpoint

    head = Checkpoint.objects.get(session=long.session, seq=long.session.head)
    assert upgrade_state_blob(head.state).value["final_answer"].startswith("Counted to")
    for step in Step.objects.filter(session=long.session).order_by("seq"):
        # Every payload has a shape the upgraders load.
        assert not present_step(step).load_error, step.seq


def test_the_overview_reads_the_same_in_sql_and_in_python(long):
    """PostgreSQL draws the overview of a long session; other databases read every step into
    Python. Both put every step in the same column and name the same waits."""
    filters = trace.TraceFilters()
    in_python = trace._overview_in_python(long.session, filters)
    in_sql = trace._overview_in_sql(long.session, filters)
    assert in_sql[0].active_seconds == pytest.approx(in_python[0].active_seconds)

    def shape(overview):
        return (
            [(c["first"], c["last"], c["failed"], c["first_failed"]) for c in overview["columns"]],
            [(g["label"], round(g["x"], 3)) for g in overview["gaps"]],
            [(r["seq"], r["crash"], round(r["x"], 3)) for r in overview["runs"]],
        )

    assert shape(in_sql[1]) == shape(in_python[1])
    assert len(in_sql[1]["columns"]) > 100


def test_tokens_and_cost_per_turn_add_up(long):
    usage = trace.usage_per_turn(long.session, trace.TraceFilters())
    assert not usage["empty"] and len(usage["bars"]) <= trace.USAGE_BARS
    assert usage["turns"] == Step.objects.filter(session=long.session, kind="model").count()
    assert usage["per_bar"] > 1 and usage["cost_line"]


# --- Query counts on a 5,000-step session -----------------------------------------------


def test_session_page_queries_do_not_grow_with_its_length(
    client, users, long, django_assert_max_num_queries
):
    client.force_login(users["operator"])
    session = long.session
    with django_assert_max_num_queries(14):
        assert client.get(reverse("sessions:detail", args=[session.id])).status_code == 200
    # From a step deep in: the turns and runs before it are counted from indexes (3 small
    # queries rather than one that reads every row before it). One more for the budgets
    # (the set_budgets steps after the head checkpoint), whatever the length.
    with django_assert_max_num_queries(18):
        url = reverse("sessions:detail", args=[session.id]) + f"?from={long.crash_call_seq}"
        assert client.get(url).status_code == 200
    with django_assert_max_num_queries(7):
        url = reverse("sessions:steps", args=[session.id]) + "?after=2500&turns=800&runs=3"
        assert client.get(url).status_code == 200
    with django_assert_max_num_queries(11):
        url = reverse("sessions:timeline", args=[session.id])
        assert client.get(url, **HX).status_code == 200
    with django_assert_max_num_queries(6):
        url = reverse("sessions:usage", args=[session.id])
        assert client.get(url, **HX).status_code == 200
