"""SIGKILL during a fan-out: workers running branches die; every branch result lands once,
the join happens once, and exactly one model turn follows it."""

from __future__ import annotations

import time

import pytest

from sessions_app.models import SideEffect, Status, Step
from sessions_app.services.core import session_start

from ..conftest import wait_final, wait_for
from .conftest import assert_invariants, kill_busy_workers_at_random

pytestmark = [pytest.mark.fault, pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ENV = {"RESPAWN_RESEARCH_DELAY": "1.0", "RESPAWN_RESEARCH_PARALLEL": "8"}


def assert_joined_once(session, branches: int) -> None:
    live = Step.objects.filter(session=session, superseded_at__isnull=True)
    calls = live.filter(kind="tool_call")
    results = live.filter(kind="tool_result")
    assert calls.count() == branches
    ids = list(results.values_list("payload__call_id", flat=True))
    assert sorted(ids) == sorted(calls.values_list("payload__call_id", flat=True)), "one each"
    models = live.filter(kind="model").order_by("seq")
    assert models.count() == 2, "the fan-out turn and exactly one turn after it"
    last_result = results.order_by("-seq").first()
    assert models.last().seq > last_result.seq, "the summary came after every result"
    joins = live.filter(kind="system", payload__event="joined")
    assert joins.count() <= 1
    # The join (if a worker did not die right in it) checkpointed the whole turn.
    for join in joins:
        assert join.seq < models.last().seq and join.seq > last_result.seq


def test_sigkill_during_fan_out_loses_and_duplicates_no_branch(fleet):
    session = session_start(agent="research", input="research checkpoints in 8 sources")
    for _ in range(4):
        fleet.start(**ENV)
    wait_for(
        lambda: Step.objects.filter(session=session, payload__event="fan_out").exists(),
        timeout=30,
        interval=0.02,
        what="the fan-out",
    )
    # Two workers die in the middle of their branches, at once.
    busy = wait_for(
        lambda: fleet.busy()[:2] if len(fleet.busy()) >= 2 else None,
        timeout=20,
        interval=0.02,
        what="two workers running branches",
    )
    time.sleep(0.3)
    for worker in busy:
        worker.kill()
    for _ in busy:
        fleet.start(**ENV)
    wait_final([session], timeout=90)
    session.refresh_from_db()
    assert session.status == Status.COMPLETED, (session.status, session.last_error)
    assert session.final_answer.startswith("checkpoints: ")
    assert_invariants(session)
    assert_joined_once(session, 8)
    # The lost branches were fanned out again under a new token.
    fan_outs = Step.objects.filter(session=session, payload__event="fan_out").order_by("seq")
    assert fan_outs.count() >= 2
    assert fan_outs.last().payload["token"] > fan_outs.first().payload["token"]
    assert not SideEffect.objects.filter(session_id=session.id).exists()


def test_random_sigkills_over_fan_out_sessions(fleet):
    import random

    rng = random.Random(8)
    sessions = [
        session_start(agent="research", input=f"research {topic} in 8 sources")
        for topic in ("leases", "fencing", "queues")
    ]
    env = {**ENV, "RESPAWN_RESEARCH_DELAY": "0.4"}
    for _ in range(4):
        fleet.start(**env)
    kills = kill_busy_workers_at_random(
        fleet, sessions, rng=rng, kills=6, within=60, pause=(0.2, 0.6), **env
    )
    wait_final(sessions, timeout=120)
    for session in sessions:
        session.refresh_from_db()
        assert session.status == Status.COMPLETED, (session.id, session.status, session.last_error)
        assert_invariants(session)
        assert_joined_once(session, 8)
    assert kills >= 3, f"only {kills} kills landed"
