"""The deploy gate covers the users' code: `check_state_compat`, run with the next release
of a team's agents, names every live session that release would strand."""

from __future__ import annotations

import json

import pytest

from sessions_app.models import Status, Step
from sessions_app.services.core import session_check_compat, session_send_message, session_start

from ..conftest import compat_gate, run_inline

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _job_keeps_the_test_connection(monkeypatch):
    monkeypatch.setattr("sessions_app.workers.jobs.close_old_connections", lambda: None)


@pytest.fixture
def live_acme_sessions(settings):
    """Released with agents v1: a refund waiting for approval, and a ticket conversation
    with a new message queued (both live, both with agent state version 1)."""
    settings.RESPAWN_AGENTS = ["acme_agents:agents_v1"]
    refund = run_inline(session_start(agent="acme", input="refund O-7 1250"))
    assert refund.status == Status.WAITING_INPUT
    tickets = run_inline(session_start(agent="acme", input="open ticket printer on fire"))
    assert tickets.status == Status.COMPLETED
    session_send_message(session_id=tickets.id, content="open ticket coffee machine")
    tickets.refresh_from_db()
    assert tickets.status == Status.QUEUED and tickets.agent_version == "1"
    return refund, tickets


def test_the_same_and_the_next_compatible_release_pass(settings, live_acme_sessions):
    out, error = compat_gate()
    assert error is None and "all 2 session(s) load with this code" in out
    assert "live sessions per agent version started on: acme 1: 2" in out
    settings.RESPAWN_AGENTS = ["acme_agents:agents_v2"]  # agent state 1 -> 2 has an upgrader
    out, error = compat_gate()
    assert error is None, out


def test_a_renamed_tool_names_the_session_waiting_to_call_it(settings, live_acme_sessions):
    refund, tickets = live_acme_sessions
    settings.RESPAWN_AGENTS = ["acme_agents:agents_renamed"]
    out, error = compat_gate()
    assert error is not None and error.returncode == 1
    assert "1 of 2 session(s) would fail" in str(error)
    block = out[out.index(f"FAIL {refund.id}") :].splitlines()
    seq = Step.objects.get(session=refund, kind="model").seq
    assert block[1:5] == [
        "  agent:  acme",
        "  status: waiting_input",
        f"  failed: tool call waiting for approval at seq {seq} (refund)",
        "  error:  agent 'acme' version 3 has no tool 'refund' (its tools: open_ticket, work, "
        "issue_refund)",
    ]
    assert f"FAIL {tickets.id}" not in out


def test_arguments_the_new_schema_refuses_name_the_session(settings, live_acme_sessions):
    refund, _ = live_acme_sessions
    settings.RESPAWN_AGENTS = ["acme_agents:agents_strict"]
    out, error = compat_gate("--json")
    assert error is not None
    [failure] = json.loads(out)["failures"]
    assert failure["session"] == str(refund.id)
    assert "the stored arguments no longer fit the tool's schema" in failure["error"]
    assert "amount: Field required" in failure["error"]
    assert "amount_cents: Extra inputs are not permitted" in failure["error"]


def test_an_agent_state_without_an_upgrader_names_every_session_holding_it(
    settings, live_acme_sessions
):
    settings.RESPAWN_AGENTS = ["acme_agents:agents_no_upgrader"]
    out, error = compat_gate()
    assert "2 of 2 session(s) would fail" in str(error)
    assert out.count("failed: agent state") == 2
    assert "no upgrader from agent state version 1 to 2 (upgraders from versions: 2)" in out


def test_a_declared_incompatible_version_and_a_removed_agent_name_every_session(
    settings, live_acme_sessions
):
    settings.RESPAWN_AGENTS = ["acme_agents:agents_incompatible"]
    out, error = compat_gate()
    assert "2 of 2 session(s) would fail" in str(error)
    assert "does not continue sessions started before version 4 (this one started on 1)" in out
    settings.RESPAWN_AGENTS = ["demo_agents:agents"]
    out, error = compat_gate()
    assert "2 of 2 session(s) would fail" in str(error)
    assert "agent 'acme' is not configured in this release (agents: approval, demo," in out


def test_checking_one_session_marks_only_what_a_worker_would_refuse(settings, live_acme_sessions):
    refund, tickets = live_acme_sessions
    settings.RESPAWN_AGENTS = ["acme_agents:agents_renamed"]
    problem = session_check_compat(session_id=refund.id)
    assert "has no tool 'refund'" in problem
    refund.refresh_from_db()
    assert not refund.is_incompatible  # the call would fail for the model to see, no more
    settings.RESPAWN_AGENTS = ["acme_agents:agents_incompatible"]
    problem = session_check_compat(session_id=tickets.id)
    tickets.refresh_from_db()
    assert tickets.is_incompatible and tickets.incompatible_agent_version == "4"
    assert problem == f"agent version: {tickets.incompatible_reason}"
    assert "does not continue sessions started before version 4" in problem
