"""Fan-out on the Django store: branches racing to record the turn's last result join it
exactly once; a branch fenced off by a cancel writes nothing; the trace and the waterfall
show the branches."""

from __future__ import annotations

import threading

import pytest
from django.db import connections
from django.urls import reverse

from agent_runtime.loop import BranchOutcome, Outcome, RunConfig, run_branch
from demo_agents import demo_agents
from sessions_app.models import Checkpoint, SideEffect, Step
from sessions_app.services.core import session_cancel, session_start
from sessions_app.store import DjangoEffects, session_store

from ..conftest import run_session_inline

AGENTS = demo_agents(research_delay=0.05, research_parallel=8)
CONFIG = RunConfig(worker_id="t", lease_ttl=30, model_backoff=0.0)


def run(session_id):
    return run_session_inline(session_id, agents=AGENTS, config=CONFIG)


def branch(session_id, seq):
    try:
        return run_branch(
            str(session_id),
            seq,
            store=session_store(),
            agents=AGENTS,
            effects=DjangoEffects(),
            config=CONFIG,
        )
    finally:
        if threading.current_thread() is not threading.main_thread():
            connections.close_all()


@pytest.mark.django_db(transaction=True)
def test_racing_branches_record_each_result_once_and_join_once():
    session = session_start(agent="research", input="research checkpoints in 8 sources")
    fanned = run(session.id)
    assert fanned.outcome == Outcome.FANNED_OUT and len(fanned.branches) == 8
    # Every branch twice, all at once: the last results race, and so do the duplicates.
    seqs = list(fanned.branches) * 2
    barrier = threading.Barrier(len(seqs))
    outcomes: list[BranchOutcome | Exception] = []

    def go(seq):
        barrier.wait()
        try:
            outcomes.append(branch(session.id, seq).outcome)
        except Exception as exc:  # shown by the assertions below, not lost in a thread
            outcomes.append(exc)

    threads = [threading.Thread(target=go, args=(seq,)) for seq in seqs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count(BranchOutcome.JOINED) == 1, outcomes
    assert outcomes.count(BranchOutcome.RECORDED) == 7, outcomes
    assert outcomes.count(BranchOutcome.NOT_NEEDED) == 8, outcomes
    results = Step.objects.filter(session=session, kind="tool_result")
    assert results.count() == 8
    assert len(set(results.values_list("payload__call_id", flat=True))) == 8
    joined = Step.objects.filter(session=session, kind="system", payload__event="joined")
    assert joined.count() == 1
    assert Checkpoint.objects.filter(session=session, seq=joined.get().seq).exists()
    session.refresh_from_db()
    assert session.lease_owner is None and session.status == "running"
    assert run(session.id).outcome == Outcome.COMPLETED
    assert Step.objects.filter(session=session, kind="model").count() == 2
    seqs_all = list(Step.objects.filter(session=session).values_list("seq", flat=True))
    assert seqs_all == list(range(1, len(seqs_all) + 1))
    assert not SideEffect.objects.filter(session_id=session.id).exists()


@pytest.mark.django_db(transaction=True)
def test_a_cancel_fences_the_branches_off():
    session = session_start(agent="research", input="research leases in 3 sources")
    fanned = run(session.id)
    session_cancel(session_id=session.id)
    assert branch(session.id, fanned.branches[0]).outcome in (
        BranchOutcome.FENCED,
        BranchOutcome.NOT_NEEDED,
    )
    assert not Step.objects.filter(session=session, kind="tool_result").exists()


@pytest.mark.django_db(transaction=True)
def test_trace_and_timeline_show_the_branches(client, users):
    session = session_start(agent="research", input="research queues in 3 sources")
    fanned = run(session.id)
    for seq in fanned.branches:
        branch(session.id, seq)
    run(session.id)
    client.force_login(users["viewer"])
    page = client.get(reverse("sessions:detail", args=[session.id])).content.decode()
    assert page.count("branch 1/3") == 2  # the call and its result
    assert page.count('class="badge branch"') == 6
    timeline = client.get(reverse("sessions:timeline", args=[session.id]), HTTP_HX_REQUEST="true")
    bars = [b for b in timeline.context["t"].bars if b["branch"]]
    assert [b["branch"] for b in bars] == ["1/3", "2/3", "3/3"] * 2
    # Each branch on its own row (branches that overlap in time run side by side).
    results = [b for b in bars if b["kind"] == "tool_result"]
    assert len({b["y"] for b in results}) == 3
    assert timeline.content.decode().count('class="bar kind-tool_result branch"') == 3
