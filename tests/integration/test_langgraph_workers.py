"""A team's LangGraph graph registered as an agent (tests/packages/acme_graphs) on real
rqworker processes: it runs, survives a SIGKILL mid-node by resuming from its last
checkpoint, waits in interrupt() until a person answers, and is rolled back, forked,
resumed and cancelled through the same services as every session."""

from __future__ import annotations

import pytest

from sessions_app.models import AgentSession, AuditEvent, GraphCheckpoint, Status, Step
from sessions_app.services.core import (
    checkpoint_rollback,
    session_fork,
    session_resume,
    session_start,
)
from sessions_app.services.graphs import session_answer_interrupt

from ..conftest import wait_for, wait_for_status
from .conftest import assert_resumed_from_a_checkpoint, cancel_and_assert_nothing_lands

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

AGENTS = "acme_graphs:agents"


def answer_of(session: AgentSession) -> str:
    step = (
        Step.objects.filter(session=session, payload__event="run_finished").order_by("-seq").first()
    )
    return step.payload.get("final_answer") if step else None


def tool_writes(session: AgentSession, live: bool = True) -> list[str]:
    steps = Step.objects.filter(
        session=session, payload__event="graph_writes", payload__node="tools"
    )
    if live:
        steps = steps.filter(superseded_at__isnull=True)
    return [
        w["value"]
        for s in steps.order_by("seq")
        for w in s.payload["writes"]
        if w["channel"] == "messages"
    ]


def test_a_graph_killed_mid_node_resumes_from_its_last_checkpoint(settings, start_worker):
    settings.RESPAWN_AGENTS = [AGENTS]
    env = {"RESPAWN_AGENTS": AGENTS, "ACME_GRAPH_DELAY": "0.8"}
    first = start_worker(**env)
    session = session_start(agent="acme-graph", input="loop 3")
    # Dies while the second work call runs: the first is checkpointed, the second is not.
    wait_for(lambda: len(tool_writes(session)) == 1, timeout=30, interval=0.02, what="step 1")
    wait_for(
        lambda: Step.objects.filter(
            session=session, payload__event="graph_checkpoint", payload__step=4
        ).exists(),
        timeout=30,
        interval=0.02,
        what="the checkpoint before the second work call",
    )
    first.kill()
    start_worker(**env)
    wait_for_status(session, Status.COMPLETED)
    assert answer_of(session) == "Worked 3 steps."
    session.refresh_from_db()
    assert session.final_answer == "Worked 3 steps."  # the session's, as for any agent
    # Each work step ran once: the second run started from the last checkpoint.
    assert [w.rsplit(": ", 1)[1] for w in tool_writes(session)] == [
        "step 1 done",
        "step 2 done",
        "step 3 done",
    ]
    assert_resumed_from_a_checkpoint(session)


def test_an_interrupt_waits_for_a_persons_answer(settings, start_worker, users):
    settings.RESPAWN_AGENTS = [AGENTS]
    start_worker(RESPAWN_AGENTS=AGENTS)
    session = session_start(agent="acme-graph", input="approve the refund")
    wait_for_status(session, Status.WAITING_INPUT)
    finished = Step.objects.filter(session=session, payload__event="run_finished").latest("seq")
    assert finished.payload["reason"] == "interrupt"
    assert "may I the refund?" in finished.payload["interrupts"][0]["value"]
    session_answer_interrupt(session_id=session.id, value="yes", actor=users["operator"])
    wait_for_status(session, Status.COMPLETED)
    assert answer_of(session) == "the refund: yes"
    event = AuditEvent.objects.get(session=session, action="answer_interrupt")
    assert event.actor_label == "olivia"


def test_rollback_fork_and_resume_a_graph_session(settings, start_worker, users):
    settings.RESPAWN_AGENTS = [AGENTS]
    start_worker(RESPAWN_AGENTS=AGENTS)
    session = session_start(agent="acme-graph", input="loop 3")
    wait_for_status(session, Status.COMPLETED)
    # Roll back to the checkpoint after the first work step (LangGraph's time travel).
    target = GraphCheckpoint.objects.filter(session=session, metadata__step=3).get()
    checkpoint_rollback(session_id=session.id, checkpoint_seq=target.seq, actor=users["operator"])
    session.refresh_from_db()
    assert session.status == Status.PAUSED and session.head == target.seq
    assert tool_writes(session) == tool_writes(session)[:1]
    session_resume(session_id=session.id, actor=users["operator"])
    wait_for_status(session, Status.COMPLETED)
    assert answer_of(session) == "Worked 3 steps."
    assert len(tool_writes(session)) == 3 and len(tool_writes(session, live=False)) == 5

    fork = session_fork(session_id=session.id, checkpoint_seq=target.seq, actor=users["operator"])
    assert fork.status == Status.PAUSED and fork.parent_id == session.id
    session_resume(session_id=fork.id, actor=users["operator"])
    wait_for_status(fork, Status.COMPLETED)
    assert answer_of(fork) == "Worked 3 steps."
    assert len(tool_writes(fork)) == 3
    actions = set(
        AuditEvent.objects.filter(session__in=[session, fork]).values_list("action", flat=True)
    )
    assert {"rollback", "resume", "fork", "forked"} <= actions


def test_cancel_stops_a_running_graph(settings, start_worker, users):
    settings.RESPAWN_AGENTS = [AGENTS]
    start_worker(RESPAWN_AGENTS=AGENTS, ACME_GRAPH_DELAY="0.5")
    session = session_start(agent="acme-graph", input="loop 20")
    wait_for(lambda: len(tool_writes(session)) >= 1, timeout=30, interval=0.02, what="a work step")
    cancel_and_assert_nothing_lands(session, users["operator"])
    assert len(tool_writes(session)) < 20
