"""SIGKILL in the middle of batch work: a 10,000-record migration survives workers dying
in it, no record is migrated twice, and every resumed run starts at the batch that was
interrupted."""

from __future__ import annotations

import random
import time

import pytest
from django.db.models import Count

from sessions_app.models import AgentSession, DemoBatch, DemoRecord, Status, Step
from sessions_app.services.core import session_start

from ..conftest import wait_final
from .conftest import assert_invariants, kill_worker_process_only, wait_for_tool_results

pytestmark = [pytest.mark.fault, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def assert_resumed_at_the_interrupted_batch(session) -> int:
    """After every run_started but the first, the first batch step continues exactly where
    the trace stood: the unanswered call again (same key), or the call after the last result.
    Returns the number of resumed runs."""
    steps = list(Step.objects.filter(session=session, superseded_at__isnull=True).order_by("seq"))
    resumes = 0
    for index, step in enumerate(steps):
        if step.kind != "system" or step.payload.get("event") != "run_started" or index < 2:
            continue
        before = [s for s in steps[:index] if s.kind in ("tool_call", "tool_result")]
        after = next(s for s in steps[index:] if s.kind in ("tool_call", "tool_result"))
        resumes += 1
        if before and before[-1].kind == "tool_call":
            # Killed inside the batch: the same call is answered, nothing new is called.
            assert after.kind == "tool_result", (session.id, step.seq)
            assert after.payload["call_id"] == before[-1].payload["call_id"]
            assert after.payload["output"]["start"] == before[-1].payload["arguments"]["cursor"]
        elif before:
            assert after.kind == "tool_call"
            assert after.payload["arguments"]["cursor"] == before[-1].payload["output"]["end"]
    return resumes


def test_sigkill_mid_batch_migrates_every_record_once(fleet):
    rng = random.Random(7340)
    session = session_start(agent="migrate", input="migrate 10,000 records in batches of 100")
    env = {"RESPAWN_BATCH_DELAY": "0.03"}
    for _ in range(2):
        fleet.start(**env)
    wait_for_tool_results([session], 1, timeout=30, what="the first batch")
    kills, started = 0, time.monotonic()
    while kills < 6 and time.monotonic() - started < 90:
        time.sleep(rng.uniform(0.4, 1.0))
        if AgentSession.objects.get(id=session.id).status != Status.RUNNING:
            break
        worker = fleet.running(session)
        if worker is None:
            continue
        if kills % 2:
            kill_worker_process_only(worker)
        else:
            worker.kill()
            fleet.start(**env)
        kills += 1
    wait_final([session], timeout=120)
    session.refresh_from_db()
    assert session.status == Status.COMPLETED, (session.status, session.last_error)
    assert session.final_answer == "Migrated 10000 records in 100 batches of 100."
    assert (session.progress_done, session.progress_total) == (10_000, 10_000)
    assert_invariants(session)
    records = DemoRecord.objects.filter(dataset=str(session.id))
    assert records.count() == 10_000
    assert not records.exclude(migrations=1).exists(), "a record migrated twice (or never)"
    batches = DemoBatch.objects.filter(dataset=str(session.id))
    assert batches.count() == 100
    assert not records.values("migrated_by_key").annotate(n=Count("id")).exclude(n=100).exists()
    # The trace shows the batches: one call per cursor, 0, 100, ..., 9,900, in order.
    calls = Step.objects.filter(session=session, kind="tool_call").order_by("seq")
    assert [c.payload["arguments"]["cursor"] for c in calls] == list(range(0, 10_000, 100))
    assert kills >= 3, f"only {kills} kills landed"
    assert assert_resumed_at_the_interrupted_batch(session) >= 3
