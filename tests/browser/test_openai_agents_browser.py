"""An OpenAI Agents SDK conversation in a real browser: a program runs the SDK's Runner
with a RespawnSession, the run stops on a tool call that needs approval, an operator reads
the conversation and approves the call in the dashboard, and a worker resumes the run."""

from __future__ import annotations

import asyncio
import concurrent.futures

import pytest
from agents import Runner

from sessions_app.models import AgentSession, AuditEvent, Status

from ..conftest import wait_for
from .conftest import login, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_operator_approves_a_paused_sdk_run_in_the_dashboard(
    page, users, settings, start_worker, sdk_model, tmp_path
):
    from acme_sdk import run_config, support

    from sessions_app.openai_agents.session import RespawnSession

    settings.RESPAWN_AGENTS = ["acme_sdk:agents"]
    log = tmp_path / "tools.log"
    session = RespawnSession("ticket-4711", agent="acme-sdk")

    async def program():
        first = await Runner.run(support, "hello", session=session, run_config=run_config)
        assert first.final_output.startswith("You said: hello")
        paused = await Runner.run(
            support, "refund O-7 1250", session=session, run_config=run_config
        )
        await session.wait_for_approval(paused)

    # The SDK program runs in a thread of its own: Playwright's loop runs in this one.
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, program()).result(timeout=60)
    finally:
        session.close()
    row = AgentSession.objects.get(id=session.respawn_id)
    assert row.status == Status.WAITING_INPUT

    start_worker(
        RESPAWN_AGENTS="acme_sdk:agents",
        ACME_SDK_BASE_URL=sdk_model.url + "/v1",
        ACME_SDK_LOG=str(log),
    )
    login(page, "olivia", "pw-operator")
    page.goto("/sessions/?status=waiting_input")
    page.locator(f"#row-{row.id} a").first.click()
    page.wait_for_url(f"**/sessions/{row.id}/")
    trace = page.locator("#trace-list").inner_text()
    assert "hello" in trace and "You said: hello" in trace and "refund" in trace
    approval = page.locator(".approval")
    assert "refund" in approval.inner_text() and "1250" in approval.inner_text()
    screenshot(page, "openai-agents-approval-waiting")
    page.get_by_role("textbox", name="approval note").fill("customer called")
    page.accept_dialogs = True  # "the tool runs now": yes
    approval.locator("button", has_text="Approve").click()
    wait_for(
        lambda: page.locator("#status").inner_text() == "Completed",
        timeout=60,
        what="the approved run",
    )
    assert page.locator(".answer").inner_text() == "Refund result: refunded 1250 on O-7"
    assert log.read_text() == "refund O-7 1250\n"
    event = AuditEvent.objects.get(session=row, action="approve")
    assert event.actor_label == "olivia" and event.before["pending"]["tool"] == "refund"
    screenshot(page, "openai-agents-approved")
    assert page.console_errors == []
