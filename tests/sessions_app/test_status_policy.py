"""Which status allows what: AgentSession's refusals are the one rule. The services refuse
by them and the dashboard offers an action by them, so neither can offer what the other
refuses."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse
from django.utils import timezone

from sessions_app.dashboard.actions import ACTIONS as DASHBOARD_ACTIONS
from sessions_app.models import AgentSession, Status
from sessions_app.services import core as services
from sessions_app.services.core import ActionError, session_start
from tests.conftest import run_inline

pytestmark = pytest.mark.django_db

# action -> (the service call, the policy that allows it)
ACTIONS: dict[str, tuple[Callable[[AgentSession], object], str]] = {
    "message": (
        lambda s: services.session_send_message(session_id=s.id, content="and then?"),
        "can_message",
    ),
    "instruct": (
        lambda s: services.session_add_instruction(session_id=s.id, text="be brief"),
        "can_edit",
    ),
    "budgets": (
        lambda s: services.session_set_budgets(
            session_id=s.id, budgets={"max_steps": 50}, resume=False
        ),
        "can_set_budgets",
    ),
    "cancel": (lambda s: services.session_cancel(session_id=s.id), "can_cancel"),
    "resume": (lambda s: services.session_resume(session_id=s.id), "can_resume"),
}


def _session_in(status: str) -> AgentSession:
    session = session_start(agent="demo", input="what is 2+2")
    # Dispatched long ago: a queued session is stuck, as the reconciler would find it.
    AgentSession.objects.filter(id=session.id).update(
        status=status, dispatched_at=timezone.now() - timedelta(hours=1)
    )
    session.refresh_from_db()
    return session


@pytest.mark.parametrize("status", Status.values)
@pytest.mark.parametrize("action", ACTIONS)
def test_the_service_refuses_exactly_what_the_policy_refuses(status, action):
    session = _session_in(status)
    run, rule = ACTIONS[action]
    allowed = getattr(session, rule)()
    # The dashboard's table names the same rule for the action.
    assert (DASHBOARD_ACTIONS[action].refusal(session) is None) == allowed
    try:
        run(session)
    except ActionError as exc:
        assert not allowed, f"{rule} allows {action} of a {status} session; refused: {exc}"
    else:
        assert allowed, f"{rule} refuses {action} of a {status} session; the service did it"


@pytest.mark.parametrize("status", Status.values)
def test_the_detail_page_offers_what_the_policy_allows(client, users, status):
    session = _session_in(status)
    client.force_login(users["operator"])
    body = client.get(reverse("sessions:detail", args=[session.id])).content.decode()
    offered = {
        action: reverse("sessions:action", args=[session.id, action]) in body
        for action in ("message", "instruct", "budgets", "cancel")
    }
    offered["resume"] = reverse("sessions:preview", args=[session.id, "resume"]) in body
    assert offered == {action: getattr(session, rule)() for action, (_, rule) in ACTIONS.items()}


def _under_a_live_worker(session: AgentSession) -> None:
    AgentSession.objects.filter(id=session.id).update(
        status=Status.RUNNING,
        lease_owner="worker-1",
        lease_expires_at=timezone.now() + timedelta(minutes=5),
    )


def test_the_trace_offers_no_rollback_under_a_live_worker(client, users):
    session = run_inline(session_start(agent="approval", input="pay"))
    detail = reverse("sessions:detail", args=[session.id])
    rollback = reverse("sessions:preview", args=[session.id, "rollback"])
    client.force_login(users["operator"])
    assert rollback in client.get(detail).content.decode()

    _under_a_live_worker(session)
    body = client.get(detail).content.decode()
    assert rollback not in body
    assert "fork from here" in body  # a fork copies the history whatever the status
    with pytest.raises(ActionError, match="cannot roll back a running session"):
        services.checkpoint_rollback(session_id=session.id, checkpoint_seq=session.head)


def test_cancelling_under_a_live_worker_says_the_worker_stops(client, users):
    session = session_start(agent="demo", input="what is 2+2")
    _under_a_live_worker(session)
    client.force_login(users["operator"])
    response = client.post(reverse("sessions:action", args=[session.id, "cancel"]))
    notes = [str(m) for m in get_messages(response.wsgi_request)]
    assert notes == ["Cancelled: the worker stops at its next step."]
    assert AgentSession.objects.get(id=session.id).status == Status.CANCELLED


def test_a_paused_by_budget_session_is_one_query_and_one_property():
    session = _session_in(Status.PAUSED)
    AgentSession.objects.filter(id=session.id).update(last_error="budget reached: 5 steps")
    session.refresh_from_db()
    assert session.paused_by_budget
    assert list(AgentSession.objects.filter(AgentSession.paused_by_budget_q())) == [session]
    AgentSession.objects.filter(id=session.id).update(status=Status.FAILED)
    session.refresh_from_db()
    assert not session.paused_by_budget
    assert not AgentSession.objects.filter(AgentSession.paused_by_budget_q()).exists()


def test_the_status_hints_say_what_the_policy_allows():
    """A status's hint names the ways back the policy leaves (a cancelled session: only a
    rollback; a failed one: a resume), and no way it refuses."""
    from sessions_app.dashboard.presenters import STATUS_TEXT

    for status, (_, hint) in STATUS_TEXT.items():
        session = AgentSession(agent="demo", status=status)
        if "resume" in hint and "resumes" not in hint:
            assert session.can_resume(), (status, hint)
        if "rollback" in hint:
            assert session.can_roll_back(), (status, hint)
    cancelled = AgentSession(agent="demo", status=Status.CANCELLED)
    assert not cancelled.can_resume() and not cancelled.can_message()
    assert cancelled.can_roll_back()
    assert "rollback" in STATUS_TEXT[Status.CANCELLED][1]


def test_a_refusal_and_a_confirmation_name_only_ways_back_the_policy_leaves():
    """A cancelled session's resume refusal points at a rollback (which the policy allows),
    not at a message (which it refuses); the cancel confirmation says the same, not that
    nothing can run it again."""
    from sessions_app.dashboard.actions import ACTIONS as TABLE

    cancelled = AgentSession(agent="demo", status=Status.CANCELLED)
    message, _ = cancelled.resume_refusal()
    assert "roll it back" in message and "message" not in message
    assert cancelled.can_roll_back() and not cancelled.can_message()
    completed = AgentSession(agent="demo", status=Status.COMPLETED)
    message, _ = completed.resume_refusal()
    assert "new message" in message and completed.can_message()
    cancel = TABLE["cancel"]
    assert "rollback" in cancel.confirm and "cannot be resumed" not in cancel.confirm
