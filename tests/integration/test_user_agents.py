"""A team's own agents (tests/packages/acme_agents, not Respawn's code) on real rqworker
processes: found through RESPAWN_AGENTS and through an installed package's entry point,
surviving a SIGKILL mid-tool, and keeping their own state across a new agent version."""

from __future__ import annotations

import importlib
import sys

import pytest

from sessions_app.models import AgentSession, Checkpoint, SideEffect, Status, Step
from sessions_app.services.core import session_send_message, session_start

from ..conftest import PACKAGES, wait_for, wait_for_status

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def head_state(session: AgentSession) -> dict:
    return Checkpoint.objects.filter(session=session, seq=session.head).latest("id").state


def test_a_teams_agent_runs_on_real_workers_found_through_respawn_agents(settings, start_worker):
    settings.RESPAWN_AGENTS = ["acme_agents:agents_v1"]
    start_worker(RESPAWN_AGENTS="acme_agents:agents_v1")
    session = session_start(agent="acme", input="open ticket printer on fire")
    assert session.agent_version == "1"
    wait_for_status(session, Status.COMPLETED)
    assert session.final_answer == "Opened printer on fire; 1 open."
    session_send_message(session_id=session.id, content="open ticket coffee machine")
    wait_for_status(session, Status.COMPLETED)
    assert session.final_answer == "Opened coffee machine; 2 open."
    assert head_state(session)["agent_state"] == {
        "version": 1,
        "data": {"tickets": ["printer on fire", "coffee machine"]},
    }


def test_a_sigkill_mid_tool_loses_nothing_and_runs_each_work_step_once(settings, start_worker):
    settings.RESPAWN_AGENTS = ["acme_agents:agents_v1"]
    env = {"RESPAWN_AGENTS": "acme_agents:agents_v1", "ACME_WORK_DELAY": "0.8"}
    first = start_worker(**env)
    session = session_start(agent="acme", input="work 3")
    # Dies in the middle of the second work call: recorded, not yet answered.
    wait_for(
        lambda: Step.objects.filter(session=session, kind="tool_call").count() == 2,
        timeout=30,
        interval=0.02,
        what="the second work call",
    )
    first.kill()
    start_worker(**env)
    wait_for_status(session, Status.COMPLETED, timeout=60)
    assert session.final_answer == "Worked 3 steps."
    effects = SideEffect.objects.filter(session_id=session.id, tool="work")
    assert sorted(e.payload["step"] for e in effects) == [1, 2, 3]  # each key once
    assert session.progress_note == "step 3 done"
    rerun = Step.objects.filter(session=session, kind="tool_call").order_by("seq")[1]
    assert Step.objects.filter(session=session, kind="tool_call").count() == 3
    assert rerun.idempotency_key == f"{session.id}:{rerun.seq}"


def test_the_agent_state_is_upgraded_by_the_next_version_and_an_old_worker_stands_aside(
    settings, start_worker
):
    settings.RESPAWN_AGENTS = ["acme_agents:agents_v1"]
    old = start_worker(RESPAWN_AGENTS="acme_agents:agents_v1")
    session = session_start(agent="acme", input="open ticket printer on fire")
    wait_for_status(session, Status.COMPLETED)
    old.stop()

    # The deploy: workers of agent version 2 (agent state 1 -> 2 through its upgrader).
    new = start_worker(RESPAWN_AGENTS="acme_agents:agents_v2")
    session_send_message(session_id=session.id, content="open ticket coffee machine")
    wait_for_status(session, Status.COMPLETED)
    assert session.final_answer == "Opened coffee machine; 2 open."
    state = head_state(session)
    assert state["agent"]["version"] == "2" and session.agent_version == "1"
    assert state["agent_state"] == {
        "version": 2,
        "data": {
            "tickets": [
                {"title": "printer on fire", "status": "open"},
                {"title": "coffee machine", "status": "open"},
            ]
        },
    }
    started = Step.objects.filter(session=session, payload__event="run_started").latest("seq")
    assert started.payload["agent_state_upgraders"] == ["1->2"]
    assert started.payload["agent_version"] == "2" and started.payload["agent_started_on"] == "1"
    new.stop()

    # A worker left on version 1 refuses the session (its state is newer than that code)
    # and marks it; a version 2 worker takes it up again by itself.
    straggler = start_worker(RESPAWN_AGENTS="acme_agents:agents_v1")
    steps_before = Step.objects.filter(session=session).count()
    session_send_message(session_id=session.id, content="open ticket stapler")
    wait_for(
        lambda: AgentSession.objects.get(id=session.id).incompatible_agent_version == "1",
        timeout=30,
        what="the old worker to refuse and mark the session",
    )
    session.refresh_from_db()
    assert "already ran on version 2, newer than this worker's version 1" in (
        session.incompatible_reason
    )
    assert Step.objects.filter(session=session).count() == steps_before + 1  # the message only
    straggler.stop()
    start_worker(RESPAWN_AGENTS="acme_agents:agents_v2")
    wait_for_status(session, Status.COMPLETED, timeout=40)
    assert session.final_answer == "Opened stapler; 3 open." and not session.is_incompatible


def test_an_installed_packages_entry_point_brings_its_agents(
    settings, start_worker, tmp_path, monkeypatch
):
    site = tmp_path / "site"
    dist = site / "acme_support-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-support\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[respawn.agents]\nacme = acme_agents:entry_agent\n")
    monkeypatch.setattr(sys, "path", [str(site), *sys.path])
    importlib.invalidate_caches()
    settings.RESPAWN_AGENTS = []  # nothing named: only what installed packages declare
    settings.RESPAWN_AGENT_ENTRY_POINTS = True
    start_worker(RESPAWN_AGENTS="", RESPAWN_AGENT_ENTRY_POINTS="1", PYTHONPATH=f"{site}:{PACKAGES}")
    session = session_start(agent="acme-ep", input="work 1")
    wait_for_status(session, Status.COMPLETED)
    assert session.final_answer == "Worked 1 steps."
    with pytest.raises(Exception, match="unknown agent 'demo'"):
        session_start(agent="demo", input="what is 1+1")
