"""Real rqworker processes against the real PostgreSQL and Redis."""

from __future__ import annotations

import time

import pytest
from rq.job import Job

from sessions_app.models import Checkpoint, SideEffect, Status, Step
from sessions_app.services.core import session_start
from sessions_app.services.dispatch import enqueue, new_job_id

from ..conftest import assert_invariants, live_conversation, wait_for, wait_for_status, wait_stopped

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

trace = live_conversation


def assert_consistent(session):
    """assert_invariants, and what a run that no fault met adds: every tool call has its
    result, and its key is the one the engine gives it (session:seq)."""
    assert_invariants(session)
    results = {
        s.payload["call_id"] for s in Step.objects.filter(session=session, kind="tool_result")
    }
    for call in Step.objects.filter(session=session, kind="tool_call"):
        assert call.payload["call_id"] in results, f"tool call {call.seq} has a result"
        assert call.idempotency_key == f"{session.id}:{call.seq}"


def test_demo_session_completes_in_a_real_worker(start_worker):
    start_worker()
    session = session_start(agent="demo", input="what is (12*7)+3, then save it as a note")
    wait_stopped(session)
    assert session.status == Status.COMPLETED
    assert session.final_answer == f"(12*7)+3 = 87. Saved as note note-{session.id}-call_1_1."
    assert session.step_count == 13
    assert Checkpoint.objects.filter(session=session).count() == 3
    assert SideEffect.objects.filter(session_id=session.id, tool="save_note").count() == 1
    assert_consistent(session)


def test_sigkill_mid_run_another_worker_finishes_with_the_same_trace(start_worker, settings):
    """Kill a worker (and its work horse) between a tool call and its result."""
    ticks = 6
    first = start_worker()
    reference = session_start(agent="slow", input=f"count to {ticks}")
    wait_stopped(reference)
    assert reference.status == Status.COMPLETED

    session = session_start(agent="slow", input=f"count to {ticks}")

    def inside_third_tick():
        last = Step.objects.filter(session=session).order_by("-seq").first()
        done = Step.objects.filter(session=session, kind="tool_result").count()
        return last is not None and last.kind == "tool_call" and done >= 2

    wait_for(inside_third_tick, timeout=30, interval=0.01, what="the third tick's tool call")
    first.kill()
    killed_at = time.monotonic()
    session.refresh_from_db()
    assert session.status == Status.RUNNING  # nobody finished it for us

    start_worker()
    wait_stopped(session, timeout=30)
    recovery = time.monotonic() - killed_at
    assert session.status == Status.COMPLETED
    assert session.final_answer == f"Counted to {ticks}."

    # Exactly the steps of the uninterrupted run, in the same order.
    assert trace(session) == trace(reference)
    assert_consistent(session)
    runs = Step.objects.filter(
        session=session, kind="system", payload__event="run_started"
    ).order_by("seq")
    # Two runs, or more on a loaded machine where a heartbeat arrives late and a third
    # worker takes over (fenced: the trace above is still exactly the uninterrupted one).
    assert runs.count() >= 2
    resumed = runs[1].payload
    assert resumed["checkpoint_seq"] is not None and resumed["steps_after_checkpoint"] >= 1
    assert session.fencing_token >= runs.count()

    # The side effect ran once per idempotency key: one row per tick, keyed by its call.
    keys = set(
        Step.objects.filter(session=session, kind="tool_call").values_list(
            "idempotency_key", flat=True
        )
    )
    effects = SideEffect.objects.filter(session_id=session.id, tool="tick")
    assert effects.count() == ticks
    assert set(effects.values_list("key", flat=True)) == keys
    # Bounded by lease TTL + reconciler period + worker start-up.
    assert recovery < settings.RESPAWN_LEASE_TTL + settings.RESPAWN_RECONCILE_INTERVAL * 1.2 + 8


def test_two_workers_handed_the_same_session_one_advances_it(start_worker, rq_queue):
    session = session_start(agent="slow", input="count to 3")
    second_job = new_job_id(session.id)
    assert enqueue(session.id, second_job)  # the same session, handed out twice
    # No reconciler here: it could hand out a third job while the first is between
    # dequeue and claim, and this test counts jobs.
    start_worker(RESPAWN_RECONCILE_INTERVAL="0")
    start_worker(RESPAWN_RECONCILE_INTERVAL="0")
    wait_stopped(session)
    assert session.status == Status.COMPLETED

    def both_done():
        jobs = [Job.fetch(j, connection=rq_queue.connection) for j in (session.job_id, second_job)]
        return [j.return_value() for j in jobs] if all(j.is_finished for j in jobs) else None

    outcomes = wait_for(both_done, timeout=20, what="both jobs to finish")
    assert sorted(outcomes) == ["completed", "not_claimed"]
    assert (
        Step.objects.filter(session=session, kind="system", payload__event="run_started").count()
        == 1
    )
    assert session.fencing_token == 1
    assert_consistent(session)


def test_approval_waits_for_a_person_then_finishes(start_worker):
    from sessions_app.services.core import session_approve

    start_worker()
    session = session_start(agent="approval", input="pay invoice INV-1")
    wait_stopped(session)
    assert session.status == Status.WAITING_INPUT
    assert not SideEffect.objects.filter(session_id=session.id).exists()
    session_approve(session_id=session.id)
    wait_for_status(session, Status.COMPLETED, timeout=20)
    assert SideEffect.objects.filter(session_id=session.id, tool="send_payment").count() == 1
    assert_consistent(session)
