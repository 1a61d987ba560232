"""Budgets that hold (steps, tokens, cost, wall time; set per session at start, raised by an
operator) and true costs (recorded per model step, summed per session, agent, model and
day), through the services, the API and the store on PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db.models import Sum
from django.utils import timezone

from sessions_app import runtime
from sessions_app.models import AgentSession, AuditEvent, ModelUsage, Step
from sessions_app.selectors.core import attention_section, session_budgets
from sessions_app.services.core import session_fork, session_start

from ..conftest import run_inline

# Committed as a worker's would be: a run's heartbeat reads the session on a connection
# of its own.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def priced(settings):
    """The scripted demo models at a price, so costs add up."""
    settings.RESPAWN_PRICES = '{"scripted:*": {"input": 20000, "output": 40000}}'
    runtime.price_table.cache_clear()
    yield
    runtime.price_table.cache_clear()


def start(call, body):
    response = call("post", "/api/sessions", body=body)
    assert response.status_code == 201, response.content
    return AgentSession.objects.get(id=response.json()["id"])


def test_a_step_budget_set_at_start_pauses_the_session_and_raising_it_continues(call):
    session = start(call, {"agent": "slow", "input": "count to 12", "budgets": {"max_steps": 8}})
    assert session.last_seq == 2  # the input and the budgets it started with

    session = run_inline(session)

    assert session.status == "paused"
    assert session.last_error == "budget reached: step limit of 8 reached"
    event = Step.objects.filter(session=session, payload__event="budget_reached").get()
    assert (event.payload["budget"], event.payload["limit"]) == ("steps", 8)
    section = attention_section("budget")
    assert [s.id for s in section.rows] == [session.id]
    shown = call("get", f"/api/sessions/{session.id}/budgets").json()
    assert shown["paused_by"] == "steps"
    assert {b["name"]: (b["limit"], b["reached"]) for b in shown["budgets"]}["steps"] == (8, True)

    raised = call("post", f"/api/sessions/{session.id}/budgets", body={"max_steps": 500})
    assert raised.status_code == 200, raised.content
    assert raised.json()["paused_by"] is None
    session.refresh_from_db()
    assert (session.status, session.last_error) == ("queued", "")
    session = run_inline(session)

    assert session.status == "completed", session.last_error
    assert "12" in session.final_answer
    audit = AuditEvent.objects.get(session_id=session.id, action="set_budgets")
    assert audit.after["budgets"] == {"max_steps": 500}
    assert attention_section("budget").rows == []


def test_a_cost_budget_pauses_at_the_model_call_that_would_exceed_it(call, priced):
    session = start(
        call,
        {"agent": "slow", "input": "count to 12", "budgets": {"max_cost": 2.0}},
    )
    session = run_inline(session)

    assert session.status == "paused"
    assert session.last_error.startswith("budget reached: cost limit of 2 reached")
    spent = sum(
        Decimal(str(s.payload["usage"]["cost"]))
        for s in Step.objects.filter(session=session, kind="model")
    )
    # Paused before the call after the one that reached it: never more than one call over.
    assert spent >= Decimal(2) and session.cost == spent
    last_call = Step.objects.filter(session=session, kind="model").order_by("-seq").first()
    assert spent - Decimal(str(last_call.payload["usage"]["cost"])) < Decimal(2)

    call("post", f"/api/sessions/{session.id}/budgets", body={"max_cost": None})
    assert run_inline(session).status == "completed"


def test_a_token_budget_pauses_and_can_be_lifted(call):
    session = start(call, {"agent": "slow", "input": "count to 10", "budgets": {"max_tokens": 60}})
    session = run_inline(session)
    assert session.status == "paused"
    assert "token limit of 60 reached" in session.last_error
    assert session.tokens_in + session.tokens_out >= 60

    call("post", f"/api/sessions/{session.id}/budgets", body={"max_tokens": None})
    assert run_inline(session).status == "completed"


def test_a_wall_time_budget_pauses_once_its_deadline_has_passed(call):
    session = start(call, {"agent": "demo", "input": "what is 2+2", "budgets": {"max_seconds": 60}})
    assert session.deadline_at == session.created_at + timedelta(seconds=60)
    # Two minutes later, as far as the session knows.
    AgentSession.objects.filter(id=session.id).update(
        created_at=session.created_at - timedelta(minutes=2),
        deadline_at=session.deadline_at - timedelta(minutes=2),
    )
    session = run_inline(session)
    assert session.status == "paused"
    assert session.last_error.startswith("budget reached: wall-time limit reached")
    assert {b.name: b.reached for b in session_budgets(session)}["time"] is True

    too_short = call("post", f"/api/sessions/{session.id}/budgets", body={"max_seconds": 30})
    assert too_short.status_code == 400
    assert "has already passed" in too_short.json()["detail"]
    assert AgentSession.objects.get(id=session.id).status == "paused"  # nothing written

    call("post", f"/api/sessions/{session.id}/budgets", body={"max_seconds": 3600})
    session.refresh_from_db()
    assert session.deadline_at == session.created_at + timedelta(hours=1)
    assert run_inline(session).status == "completed"


@pytest.mark.parametrize(
    "body, status, message",
    [
        ({"max_steps": 0}, 422, "max_steps"),
        ({"max_cost": -1}, 422, "max_cost"),
        ({"max_steps": None}, 422, "max_steps"),
        ({"max_step": 5}, 422, "max_step"),
        ({"max_cost": True}, 422, "max_cost must be a number"),
    ],
)
def test_bad_budgets_are_refused_naming_the_field(call, body, status, message):
    session = start(call, {"agent": "demo", "input": "what is 2+2"})
    session = run_inline(session)
    response = call("post", f"/api/sessions/{session.id}/budgets", body=body)
    assert response.status_code == status, response.content
    assert message in response.content.decode()
    assert not Step.objects.filter(session=session, payload__action="set_budgets").exists()


def test_budgets_of_a_running_session_cannot_change(call):
    session = start(call, {"agent": "demo", "input": "what is 2+2"})
    response = call("post", f"/api/sessions/{session.id}/budgets", body={"max_steps": 9})
    assert response.status_code == 409
    assert "queued or running" in response.json()["detail"]


def test_a_viewer_reads_budgets_but_cannot_set_them(call):
    session = start(call, {"agent": "demo", "input": "what is 2+2"})
    assert call("get", f"/api/sessions/{session.id}/budgets", role="viewer").status_code == 200
    refused = call(
        "post", f"/api/sessions/{session.id}/budgets", role="viewer", body={"max_steps": 9}
    )
    assert refused.status_code == 403


# --- Costs -------------------------------------------------------------------------------


def test_costs_add_up_per_session_agent_model_and_day_and_outlive_the_session(call, priced):
    sessions = [
        run_inline(start(call, {"agent": agent, "input": text}))
        for agent, text in [
            ("demo", "what is (12*7)+3, then save it as a note"),
            ("demo", "what is 2+2"),
            ("slow", "count to 5"),
        ]
    ]
    assert all(s.status == "completed" for s in sessions)
    for session in sessions:
        model_steps = Step.objects.filter(session=session, kind="model")
        step_cost = sum(Decimal(str(s.payload["usage"]["cost"])) for s in model_steps)
        assert step_cost > 0 and session.cost == step_cost
        usage = ModelUsage.objects.filter(session_id=session.id).aggregate(
            cost=Sum("cost"), calls=Sum("calls"), tokens_in=Sum("tokens_in")
        )
        assert usage["cost"] == step_cost
        assert usage["calls"] == model_steps.count()
        assert usage["tokens_in"] == sum(s.tokens_in for s in model_steps)

    by_agent = call("get", "/api/usage?group=agent").json()
    costs = {row["key"]: row["cost"] for row in by_agent["items"]}
    for agent in ("demo", "slow"):
        expected = sum(float(s.cost) for s in sessions if s.agent == agent)
        assert costs[agent] == pytest.approx(expected)
    assert by_agent["total"]["cost"] == pytest.approx(sum(float(s.cost) for s in sessions))
    today = timezone.now().date().isoformat()
    by_day = call("get", f"/api/usage?group=day&since={today}&until={today}").json()
    assert [row["key"] for row in by_day["items"]] == [today]
    assert by_day["items"][0]["cost"] == pytest.approx(by_agent["total"]["cost"])
    by_model = call("get", "/api/usage?group=model").json()
    assert {row["key"] for row in by_model["items"]} == {"scripted:demo", "scripted:slow"}

    # A fork carries the cost of the history it copies (as it carries its tokens); it has
    # spent nothing itself.
    fork = session_fork(session_id=sessions[1].id, checkpoint_seq=sessions[1].head)
    assert fork.cost == sessions[1].cost > 0
    assert not ModelUsage.objects.filter(session_id=fork.id).exists()

    # Retention deletes sessions; what they cost stays on the books.
    AgentSession.objects.filter(id=sessions[0].id).delete()
    after = call("get", "/api/usage?group=agent").json()
    assert after["total"]["cost"] == pytest.approx(by_agent["total"]["cost"])


@pytest.mark.parametrize(
    "query, message",
    [
        ("group=week", "group must be one of day, agent, model"),
        ("since=2026-13-01", "since"),
        ("until=yesterday", "until"),
    ],
)
def test_a_bad_usage_query_names_the_problem(call, query, message):
    response = call("get", f"/api/usage?{query}")
    assert response.status_code == 400
    assert message in response.json()["detail"]


def test_budgets_set_at_start_hold_for_an_agent_no_longer_registered():
    """The set_budgets steps after the head fold in as the engine folds them
    (agent_runtime.state.apply_budgets), whatever limits they start from: here none, the
    agent being gone from the registry and no checkpoint written yet."""
    session = session_start(agent="demo", input="hello", budgets={"max_steps": 7})
    AgentSession.objects.filter(id=session.id).update(agent="retired")
    session.refresh_from_db()
    assert {b.name: b.limit for b in session_budgets(session)}["steps"] == 7
