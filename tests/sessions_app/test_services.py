from __future__ import annotations

import uuid

import pytest

from agent_runtime.state import SCHEMA_VERSION
from sessions_app.models import AgentSession, AuditEvent, Checkpoint, Status, Step
from sessions_app.services.core import (
    BULK_DISPATCH_NOW,
    ActionError,
    checkpoint_rollback,
    session_add_instruction,
    session_approve,
    session_cancel,
    session_correct_result,
    session_reject,
    session_resolve_uncertain,
    session_resume,
    session_resume_in_bulk,
    session_send_message,
    session_start,
)
from sessions_app.store import session_store

from ..conftest import run_inline

pytestmark = pytest.mark.django_db


def test_start_creates_session_with_first_user_step_and_audit(users):
    session = session_start(agent="demo", input="  what is 1+1  ", actor=users["operator"])
    session.refresh_from_db()
    assert session.status == Status.QUEUED
    assert session.title == "what is 1+1"
    assert session.job_id.startswith(f"run-{session.id}-")
    step = Step.objects.get(session=session)
    assert (step.seq, step.kind, step.schema_version) == (1, "user", SCHEMA_VERSION)
    assert step.payload == {"content": [{"type": "text", "text": "what is 1+1"}]}
    event = AuditEvent.objects.get(session=session)
    assert event.action == "start" and event.actor_label == "olivia"


@pytest.mark.parametrize(
    ("agent", "text", "message"),
    [
        ("nope", "hello", "unknown agent 'nope'"),
        ("", "hello", "unknown agent ''"),
        ("demo", "", "input must not be empty"),
        ("demo", "   \n ", "input must not be empty"),
    ],
)
def test_start_rejects_bad_input_and_writes_nothing(agent, text, message):
    with pytest.raises(ActionError, match=message):
        session_start(agent=agent, input=text)
    assert AgentSession.objects.count() == 0
    assert Step.objects.count() == 0
    assert AuditEvent.objects.count() == 0


def test_run_inline_stores_steps_and_checkpoints():
    session = session_start(agent="demo", input="what is (12*7)+3, then save it as a note")
    run_inline(session)
    session.refresh_from_db()
    assert session.status == Status.COMPLETED
    assert session.final_answer.startswith("(12*7)+3 = 87.")
    assert session.step_count == session.last_seq == 13
    assert list(Step.objects.filter(session=session).values_list("seq", flat=True)) == list(
        range(1, 14)
    )
    assert session.head == 13
    assert list(Checkpoint.objects.filter(session=session).values_list("seq", flat=True)) == [
        7,
        12,
        13,
    ]
    assert session.tokens_in > 0 and session.tokens_out > 0
    assert session.lease_owner is None


def test_resume_rules():
    session = session_start(agent="echo", input="hi")
    run_inline(session)
    with pytest.raises(ActionError, match="cannot be resumed"):
        session_resume(session_id=session.id)
    with pytest.raises(ActionError, match="no session with id"):
        session_resume(session_id=uuid.uuid4())

    running = session_start(agent="slow", input="count to 2")
    store = session_store()
    store.claim(str(running.id), "someone", ttl=60)
    with pytest.raises(ActionError, match="already running"):
        session_resume(session_id=running.id)


def test_resume_of_failed_session_queues_it_and_fences_the_old_lease():
    session = session_start(agent="echo", input="hi")
    AgentSession.objects.filter(id=session.id).update(
        status=Status.FAILED, last_error="boom", fencing_token=4
    )
    resumed = session_resume(session_id=session.id)
    resumed.refresh_from_db()
    assert resumed.status == Status.QUEUED and resumed.last_error == ""
    assert resumed.fencing_token == 5
    assert AuditEvent.objects.filter(session=session, action="resume").count() == 1


def test_bulk_resume_enqueues_the_first_ones_and_leaves_the_rest_to_the_reconciler():
    first, later = (session_start(agent="echo", input=f"hi {n}") for n in range(2))
    AgentSession.objects.filter(id__in=[first.id, later.id]).update(status=Status.FAILED)

    assert session_resume_in_bulk(session_id=first.id, position=BULK_DISPATCH_NOW - 1) == "queued"
    assert (
        session_resume_in_bulk(session_id=later.id, position=BULK_DISPATCH_NOW)
        == "queued (dispatched by the reconciler)"
    )

    first.refresh_from_db()
    later.refresh_from_db()
    assert first.status == later.status == Status.QUEUED
    assert first.dispatched_at is not None and first.job_id.startswith(f"run-{first.id}-")
    assert later.dispatched_at is None and later.job_id == ""


def _summary(session):
    session.refresh_from_db()
    return {
        "status": session.status,
        "head": session.head,
        "last_seq": session.last_seq,
        "fencing_token": session.fencing_token,
    }


def test_operator_edits_append_a_step_queue_the_session_and_audit_before_and_after(users):
    olivia = users["operator"]
    session = session_start(agent="demo", input="what is (12*7)+3, then save it as a note")
    run_inline(session)
    result = Step.objects.get(session=session, kind="tool_result", payload__name="calculator")

    def edit(action, apply):
        """Apply one edit to the completed session; its step, its audit event."""
        AgentSession.objects.filter(id=session.id).update(
            status=Status.COMPLETED, last_error="earlier trouble", job_id=""
        )
        before = _summary(session)
        apply()
        after = _summary(session)
        assert after["status"] == Status.QUEUED
        assert session.last_error == "" and session.job_id.startswith(f"run-{session.id}-")
        assert after["last_seq"] == before["last_seq"] + 1
        assert after["fencing_token"] == before["fencing_token"] + 1
        event = AuditEvent.objects.get(session=session, action=action)
        assert event.actor == olivia
        step = Step.objects.get(session=session, seq=after["last_seq"])
        return step, event, before, {**after, "step": step.seq}

    step, event, before, after = edit(
        "correct_result",
        lambda: session_correct_result(
            session_id=session.id, result_seq=result.seq, output={"value": 88}, actor=olivia
        ),
    )
    assert step.kind == "operator" and step.payload["output"] == {"value": 88}
    assert event.before == {**before, "result_seq": result.seq, "original": result.payload}
    assert event.after == {**after, "output": {"value": 88}}

    step, event, before, after = edit(
        "instruction",
        lambda: session_add_instruction(session_id=session.id, text="be brief", actor=olivia),
    )
    assert step.kind == "operator" and step.payload["action"] == "instruction"
    assert (event.before, event.after) == (before, {**after, "text": "be brief"})

    step, event, before, after = edit(
        "message",
        lambda: session_send_message(session_id=session.id, content="and 2+2?", actor=olivia),
    )
    assert step.kind == "user" and session.final_answer == ""
    assert (event.before, event.after) == (before, after)


def test_failing_an_uncertain_call_audits_it_and_queues_nothing(users):
    from tests.sessions_app.test_dashboard import _uncertain_notify_session

    session = _uncertain_notify_session()
    before, job_id = _summary(session), session.job_id

    session_resolve_uncertain(
        session_id=session.id, resolution="fail", note=" never sent ", actor=users["operator"]
    )

    after = _summary(session)
    assert after["status"] == Status.FAILED and session.job_id == job_id
    assert session.last_error == (
        "failed by olivia: tool call call_0_0 may or may not have happened"
    )
    step = Step.objects.get(session=session, seq=after["last_seq"])
    assert step.kind == "operator"
    assert step.payload == {
        "action": "fail",
        "call_id": "call_0_0",
        "actor": "olivia",
        "note": "never sent",
    }
    event = AuditEvent.objects.get(session=session, action="uncertain_fail")
    assert event.before == {**before, "uncertain_call": "call_0_0"}
    assert event.after == {**after, "step": step.seq}


def test_cancel_is_immediate_and_fences_off_a_running_worker():
    queued = session_start(agent="slow", input="count to 5")
    session_cancel(session_id=queued.id)
    queued.refresh_from_db()
    assert queued.status == Status.CANCELLED
    assert queued.steps.last().payload["action"] == "cancel"
    with pytest.raises(ActionError, match="already cancelled"):
        session_cancel(session_id=queued.id)

    running = session_start(agent="slow", input="count to 5")
    store = session_store()
    lease = store.claim(str(running.id), "w", ttl=60)
    session_cancel(session_id=running.id)
    running.refresh_from_db()
    assert running.status == Status.CANCELLED and running.lease_owner is None
    assert running.steps.last().payload["while_running"] is True
    from agent_runtime.state import NewStep, StepKind
    from agent_runtime.store import LeaseLost

    with pytest.raises(LeaseLost):  # the worker's next write lands nowhere
        store.append(lease, [NewStep(kind=StepKind.SYSTEM, payload={"event": "late"})])
    assert not running.steps.filter(payload__event="late").exists()


def test_approve_runs_the_pending_tool(users):
    session = session_start(agent="approval", input="pay invoice 9")
    run_inline(session)
    session.refresh_from_db()
    assert session.status == Status.WAITING_INPUT
    with pytest.raises(ActionError, match="waiting for an approval"):
        session_resume(session_id=session.id)
    session_approve(session_id=session.id, actor=users["operator"])
    session.refresh_from_db()
    assert session.status == Status.QUEUED
    decision = session.steps.order_by("-seq").first()
    assert decision.kind == "operator"
    assert decision.payload == {
        "action": "approve",
        "call_id": "call_0_0",
        "tool": "send_payment",
        "actor": "olivia",
    }
    run_inline(session)
    session.refresh_from_db()
    assert session.status == Status.COMPLETED
    assert session.final_answer.startswith("Payment sent: reference pay-")
    assert AuditEvent.objects.filter(
        session=session, action="approve", actor=users["operator"]
    ).exists()


def test_reject_and_nothing_pending():
    session = session_start(agent="approval", input="pay invoice 9")
    with pytest.raises(ActionError, match="nothing is waiting"):
        session_reject(session_id=session.id)
    run_inline(session)
    session_reject(session_id=session.id, reason="wrong amount")
    run_inline(session)
    session.refresh_from_db()
    assert session.final_answer == "Payment not sent: rejected by system: wrong amount"


def test_rollback_supersedes_later_steps_and_pauses():
    session = session_start(agent="demo", input="what is (12*7)+3, then save it as a note")
    run_inline(session)
    checkpoint_rollback(session_id=session.id, checkpoint_seq=7)
    session.refresh_from_db()
    assert session.status == Status.PAUSED and session.head == 7
    superseded = list(
        session.steps.filter(superseded_at__isnull=False).values_list("seq", flat=True)
    )
    assert superseded == list(range(8, 14))
    assert session.steps.count() == 14  # nothing deleted; the rollback itself is step 14
    assert Checkpoint.objects.filter(session=session, reason="before-rollback", seq=13).exists()
    with pytest.raises(ActionError, match="no checkpoint at seq 5"):
        checkpoint_rollback(session_id=session.id, checkpoint_seq=5)
    # Resume continues from checkpoint 7 and reaches the same answer again.
    session_resume(session_id=session.id)
    run_inline(session)
    session.refresh_from_db()
    assert session.status == Status.COMPLETED
    assert session.final_answer.startswith("(12*7)+3 = 87. Saved as note")
    live = session.steps.filter(superseded_at__isnull=True).order_by("seq")
    assert [s.kind for s in live][:8] == [
        "user",
        "system",
        "model",
        "tool_call",
        "tool_result",
        "tool_call",
        "tool_result",
        "operator",
    ]


@pytest.mark.parametrize("status", [s.value for s in Status])
@pytest.mark.parametrize("lease", ["none", "live", "expired"])
def test_the_resume_button_is_offered_exactly_when_the_resume_is_allowed(status, lease):
    from datetime import timedelta

    from django.utils import timezone

    now = timezone.now()
    fields = {"status": status, "dispatched_at": now - timedelta(hours=1)}
    if lease != "none":
        delta = timedelta(minutes=5)
        fields.update(
            lease_owner="w", lease_expires_at=now + delta if lease == "live" else now - delta
        )
    session = AgentSession.objects.create(agent="echo", last_seq=1, step_count=1, **fields)
    offered = session.can_resume()
    try:
        session_resume(session_id=session.id, dispatch_now=False)
    except ActionError:
        allowed = False
    else:
        allowed = True
    assert offered == allowed, (status, lease)
