"""The Agents page in a real browser: a team's own agents, their tools and versions, and
the way from an agent to its live sessions."""

from __future__ import annotations

import re

import pytest

from sessions_app.models import AgentSession
from sessions_app.services.core import session_start

from ..conftest import run_inline, wait_for
from .conftest import login, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_operator_finds_the_agents_their_tools_and_live_sessions_per_version(
    page, users, settings
):
    settings.RESPAWN_AGENTS = ["acme_agents:agents_v1", "demo_agents:agents"]
    waiting = run_inline(session_start(agent="acme", input="refund O-7 1250"))
    run_inline(session_start(agent="acme", input="open ticket printer on fire"))
    AgentSession.objects.create(agent="acme", agent_version="0.9", title="from an older release")
    AgentSession.objects.create(agent="retired", title="an agent this deployment dropped")

    login(page, "victor", "pw-viewer")
    page.click("nav >> text=Agents")
    page.wait_for_url("**/sessions/agents/")
    acme = page.locator("#agent-acme")
    assert acme.locator("h2").inner_text() == "acme version 1"
    assert "computed from the session state" in acme.locator("pre.instructions").inner_text()
    assert "RESPAWN_AGENTS entry 'acme_agents:agents_v1'" in acme.inner_text()
    refund = acme.locator("#tool-acme-refund")
    assert "needs approval" in refund.inner_text() and "not idempotent" in refund.inner_text()
    assert "amount_cents: integer" in refund.inner_text()
    refund.locator("summary").click()
    assert '"required": [' in refund.locator("pre").inner_text()
    missing = page.locator(".agents-missing")
    assert "retired: 1 live session" in missing.inner_text()
    screenshot(page, "agents")
    assert page.console_errors == []

    # Live: the refund waiting for approval (started on 1) and one from release 0.9; the
    # completed ticket session counts among all sessions only.
    assert "2 live" in acme.inner_text()
    assert acme.locator("a.count").all_inner_texts() == ["version 1 1", "version 0.9 1"]
    acme.locator("a.count", has_text="version 1").click()
    page.wait_for_url(re.compile(r"agent=acme&agent_version=1"))
    wait_for(lambda: page.locator("tr.session-row").count() == 2, what="the filtered list")
    assert page.locator(f"#row-{waiting.id}").count() == 1
    assert page.locator("input[name=agent_version]").input_value() == "1"

    page.goto(f"/sessions/{waiting.id}/")
    assert "started on version 1" in page.locator("#agent").inner_text()
    page.locator("#agent-state summary").click()
    assert '"tickets": []' in page.locator("#agent-state pre").inner_text()
    page.locator("#agent a").click()
    page.wait_for_url("**/sessions/agents/#agent-acme")
    assert page.console_errors == []
