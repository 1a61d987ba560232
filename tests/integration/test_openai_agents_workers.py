"""An OpenAI Agents SDK agent registered through the agent API (tests/packages/acme_sdk)
on real rqworker processes, its model a local Chat Completions stub: a run killed mid-tool
resumes from the last stored turn on another worker, a paused run is approved over the
JSON API and resumed by a worker, and cancel, fork and resume work as for any session."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessions_app.models import AgentSession, ApiToken, Checkpoint, Status, Step
from sessions_app.services.core import session_fork, session_resume, session_start

from ..conftest import wait_for, wait_for_status
from .conftest import assert_resumed_from_a_checkpoint, cancel_and_assert_nothing_lands

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

AGENTS = "acme_sdk:agents"


def tool_results(session: AgentSession, live: bool = True) -> list[str]:
    steps = Step.objects.filter(session=session, kind="tool_result")
    if live:
        steps = steps.filter(superseded_at__isnull=True)
    return [s.payload["output"] for s in steps.order_by("seq")]


def kill_once_logged(worker, log: Path, line: str, what: str) -> None:
    """SIGKILL the worker as soon as the acme tools' log shows `line` (a call under way)."""
    wait_for(lambda: log.exists() and line in log.read_text(), timeout=60, interval=0.02, what=what)
    worker.kill()


def env(sdk_model, log_path, **extra) -> dict[str, str]:
    return {
        "RESPAWN_AGENTS": AGENTS,
        "ACME_SDK_BASE_URL": sdk_model.url + "/v1",
        "ACME_SDK_LOG": str(log_path),
        **extra,
    }


def test_an_sdk_run_killed_mid_tool_resumes_from_the_last_stored_turn(
    settings, start_worker, sdk_model, tmp_path
):
    settings.RESPAWN_AGENTS = [AGENTS]
    log = tmp_path / "tools.log"
    first = start_worker(**env(sdk_model, log, ACME_SDK_DELAY="1.0"))
    session = session_start(agent="acme-sdk", input="loop 3")
    # Dies while the second work call runs: the first turn (call and output) is stored.
    wait_for(lambda: len(tool_results(session)) == 1, timeout=60, interval=0.02, what="step 1")
    # The second call is in the trace while it runs, before its turn's items are stored.
    wait_for(
        lambda: Step.objects.filter(
            session=session, payload__event="sdk_tool_started", payload__arguments__step=2
        ).exists(),
        timeout=60,
        interval=0.02,
        what="the second work call in the trace",
    )
    assert len(tool_results(session)) == 1
    kill_once_logged(first, log, "work 2 started", "the second work call to start")
    start_worker(**env(sdk_model, log, ACME_SDK_DELAY="0.1"))
    wait_for_status(session, Status.COMPLETED)
    assert session.final_answer == "Worked 3 steps."
    assert tool_results(session) == ["step 1 done", "step 2 done", "step 3 done"]
    # The first step ran once; the second ran again (at least once: it died mid-call).
    lines = log.read_text().splitlines()
    assert lines.count("work 1 started") == 1
    assert lines.count("work 2 started") == 2 and lines.count("work 2 done") == 1
    assert_resumed_from_a_checkpoint(session)


def test_an_approval_over_the_api_is_resumed_by_a_worker(
    settings, start_worker, sdk_model, tmp_path, users, live_server
):
    import requests

    settings.RESPAWN_AGENTS = [AGENTS]
    log = tmp_path / "tools.log"
    start_worker(**env(sdk_model, log))
    session = session_start(agent="acme-sdk", input="refund O-7 1250")
    wait_for_status(session, Status.WAITING_INPUT)
    assert not log.exists()
    _, key = ApiToken.issue(users["operator"], "tests")
    headers = {"Authorization": f"Bearer {key}"}
    detail = requests.get(
        f"{live_server.url}/api/sessions/{session.id}", headers=headers, timeout=10
    )
    assert detail.status_code == 200
    pending = detail.json()["pending_approval"]
    assert pending["tool"] == "refund" and pending["arguments"] == {"order": "O-7", "amount": 1250}
    decided = requests.post(
        f"{live_server.url}/api/sessions/{session.id}/approve",
        json={"reason": "within policy"},
        headers=headers,
        timeout=10,
    )
    assert decided.status_code == 202, decided.text
    wait_for_status(session, Status.COMPLETED)
    assert session.final_answer == "Refund result: refunded 1250 on O-7"
    assert log.read_text() == "refund O-7 1250\n"


def test_cancel_fork_and_resume_an_sdk_session(settings, start_worker, sdk_model, tmp_path, users):
    settings.RESPAWN_AGENTS = [AGENTS]
    log = tmp_path / "tools.log"
    start_worker(**env(sdk_model, log, ACME_SDK_DELAY="0.4"))
    session = session_start(agent="acme-sdk", input="loop 20")
    wait_for(lambda: len(tool_results(session)) >= 2, timeout=60, interval=0.02, what="two steps")
    cancel_and_assert_nothing_lands(session, users["operator"])
    assert len(tool_results(session)) < 20

    # Fork at the checkpoint after the first work step: the fork runs the rest itself.
    target = Checkpoint.objects.filter(session=session, seq__gt=1).order_by("seq").first()
    fork = session_fork(session_id=session.id, checkpoint_seq=target.seq, actor=users["operator"])
    assert fork.status == Status.PAUSED and tool_results(fork) == ["step 1 done"]
    session_resume(session_id=fork.id, actor=users["operator"])
    wait_for_status(fork, Status.COMPLETED, timeout=90)
    assert fork.final_answer == "Worked 20 steps."
    assert tool_results(fork) == [f"step {n} done" for n in range(1, 21)]


def test_a_worker_killed_while_the_approved_call_runs_resumes_from_the_stored_run_state(
    settings, start_worker, sdk_model, tmp_path, users
):
    from sessions_app.services.core import session_approve

    settings.RESPAWN_AGENTS = [AGENTS]
    log = tmp_path / "tools.log"
    first = start_worker(**env(sdk_model, log, ACME_SDK_DELAY="2.0"))
    session = session_start(agent="acme-sdk", input="refund O-7 1250")
    wait_for_status(session, Status.WAITING_INPUT)
    session_approve(session_id=session.id, actor=users["operator"])
    kill_once_logged(first, log, "refund O-7 1250", "the approved refund to start")
    start_worker(**env(sdk_model, log, ACME_SDK_DELAY="0.1"))
    wait_for_status(session, Status.COMPLETED)
    assert session.final_answer == "Refund result: refunded 1250 on O-7"
    # The approval held across the crash: the call ran again (at least once), not asked again.
    assert log.read_text() == "refund O-7 1250\nrefund O-7 1250\n"
    assert Step.objects.filter(session=session, payload__event="approval_requested").count() == 1
    assert tool_results(session) == ["refunded 1250 on O-7"]
