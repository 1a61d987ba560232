"""The deploy gate covers every kind of agent: an OpenAI Agents SDK agent whose tool a
waiting call needs, and a LangGraph graph whose node an interrupt waits in, are named when
the next release removes them; a program's own RespawnSaver threads never fail the gate
and are no approvals waiting."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone
from langchain_core.messages import HumanMessage

from sessions_app.models import AgentSession, Status
from sessions_app.selectors.core import attention_section
from sessions_app.services.core import session_approve, session_reject, session_start
from sessions_app.services.graphs import session_answer_interrupt

from ..conftest import compat_gate, run_inline
from ..stubs.sdk_model import sdk_model  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _job_keeps_the_test_connection(monkeypatch):
    monkeypatch.setattr("sessions_app.workers.jobs.close_old_connections", lambda: None)


@pytest.fixture
def waiting_refund(sdk_model, settings):  # noqa: F811
    """An SDK agent's run paused on `refund` (it needs a person's approval)."""
    settings.RESPAWN_AGENTS = ["acme_sdk:agents"]
    row = run_inline(session_start(agent="acme-sdk", input="refund O-9 30"))
    assert row.status == Status.WAITING_INPUT, row.last_error
    return row


def _fails_on(settings, release: str, session) -> tuple[str, str, str]:
    """The gate passes with the agents the session runs on and fails with `release`: the
    "failed:" and "error:" lines it prints for the session, and how it ended."""
    out, error = compat_gate()
    assert error is None, out
    settings.RESPAWN_AGENTS = [release]
    out, error = compat_gate()
    assert error is not None and error.returncode == 1, out
    block = out[out.index(f"FAIL {session.id}") :].splitlines()
    return block[3], block[4], str(error)


def test_an_sdk_tool_a_waiting_call_needs_is_named_when_removed(settings, waiting_refund):
    failed, error, ended = _fails_on(settings, "acme_sdk:agents_without_refund", waiting_refund)
    assert "1 of 1 session(s) would fail" in ended
    assert failed.startswith("  failed: tool call waiting for approval at seq ")
    assert failed.endswith(" (refund)")
    assert error == (
        "  error:  agent 'acme-sdk' (SDK agent 'acme-support') has no tool 'refund' "
        "(its tools: work)"
    )


def test_an_approved_sdk_call_not_yet_run_is_named(settings, users, waiting_refund):
    session_approve(session_id=waiting_refund.id, actor=users["operator"])
    settings.RESPAWN_AGENTS = ["acme_sdk:agents_without_refund"]
    out, error = compat_gate("--json")
    assert error is not None, out
    [failure] = json.loads(out)["failures"]
    assert failure["where"].startswith("approved tool call at seq ")
    assert "has no tool 'refund'" in failure["error"]


def test_a_rejected_sdk_call_does_not_hold_the_deploy(settings, users, waiting_refund):
    session_reject(session_id=waiting_refund.id, actor=users["operator"], reason="no")
    settings.RESPAWN_AGENTS = ["acme_sdk:agents_without_refund"]
    out, error = compat_gate()
    assert error is None, out


@pytest.fixture
def graph_at_interrupt(settings):
    """A graph agent's session waiting in its `model` node at an interrupt()."""
    settings.RESPAWN_AGENTS = ["acme_graphs:agents"]
    row = run_inline(session_start(agent="acme-graph", input="approve the refund"))
    assert row.status == Status.WAITING_INPUT, row.last_error
    return row


def test_a_graph_node_an_interrupt_waits_in_is_named_when_removed(
    settings, users, graph_at_interrupt
):
    failed, error, _ = _fails_on(settings, "acme_graphs:agents_renamed_node", graph_at_interrupt)
    assert failed.startswith("  failed: interrupt waiting for an answer at seq ")
    assert failed.endswith(" (model)")
    assert error == (
        "  error:  the graph of agent 'acme-graph' has no node 'model' (its nodes: "
        "assistant, tools): resuming the session would not run it"
    )
    # Answered, the release that still has the node runs it to the end.
    settings.RESPAWN_AGENTS = ["acme_graphs:agents"]
    session_answer_interrupt(session_id=graph_at_interrupt.id, value="yes", actor=users["operator"])
    row = run_inline(graph_at_interrupt)
    assert row.status == Status.COMPLETED, row.last_error
    settings.RESPAWN_AGENTS = ["acme_graphs:agents_renamed_node"]
    out, error = compat_gate()
    assert error is None, out


def test_a_programs_own_saver_threads_pass_the_gate_and_wait_for_no_approval(settings):
    from acme_graphs import builder

    from sessions_app.langgraph import RespawnSaver

    settings.RESPAWN_AGENTS = ["acme_agents:agents_v1"]
    settings.RESPAWN_APPROVAL_SLA = 60
    saver = RespawnSaver()
    try:
        graph = builder().compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "ticket-7"}}
        graph.invoke({"messages": [HumanMessage("approve the refund")]}, config)
        assert graph.get_state(config).interrupts
    finally:
        saver.close()
    [row] = AgentSession.objects.filter(agent="langgraph")
    assert row.status == Status.WAITING_INPUT
    AgentSession.objects.filter(id=row.id).update(updated_at=timezone.now() - timedelta(hours=2))

    out, error = compat_gate()
    assert error is None, out
    assert "all 0 session(s) load with this code" in out
    assert (
        "not checked, run and checked by their own program: langgraph (a LangGraph program "
        "using RespawnSaver): 1"
    ) in out
    out, _ = compat_gate("--json")
    assert json.loads(out)["run_by_their_program"] == {"langgraph": 1}
    assert attention_section("approvals").rows == []

    # A deployment that registers a graph agent of that name runs them: checked then.
    settings.RESPAWN_AGENTS = ["acme_graphs:agents_named_langgraph"]
    assert [r.id for r in attention_section("approvals").rows] == [row.id]
