"""Budgets and costs in a real browser: a session paused by its budget shows why, is found
under "needs attention", and an operator raises the budget and resumes it from its page;
the costs page sums what the model calls cost."""

from __future__ import annotations

import pytest

from sessions_app import runtime
from sessions_app.models import AgentSession
from sessions_app.services.core import session_start

from ..conftest import run_inline, wait_for
from .conftest import console_errors, login, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_operator_raises_the_budget_that_paused_a_session_and_it_finishes(page, users, settings):
    settings.RESPAWN_PRICES = '{"scripted:*": {"input": 300, "output": 600}}'
    runtime.price_table.cache_clear()
    try:
        session = run_inline(
            session_start(agent="slow", input="count to 6", budgets={"max_steps": 6})
        )
        done = run_inline(session_start(agent="demo", input="what is 6*7"))
    finally:
        runtime.price_table.cache_clear()
    assert session.status == "paused"

    login(page, "olivia", "pw-operator")
    page.click("nav >> text=Needs attention")
    section = page.locator("#sec-budget")
    assert "Paused by a budget" in section.inner_text()
    section.locator(f"a[href='/sessions/{session.id}/']").first.click()
    page.wait_for_url(f"**/sessions/{session.id}/")

    assert "step limit of 6 reached" in page.locator(".error-box").inner_text()
    steps = page.locator("#budgets [data-budget=steps]")
    assert "reached" in steps.inner_text() and "reached" in (steps.get_attribute("class") or "")
    form = page.locator("#set-budgets")
    assert form.get_attribute("open") is not None  # opened for the paused session
    screenshot(page, "budget-paused")

    form.locator("input[name=max_steps]").fill("many")
    form.get_by_role("button", name="Set budgets").click()
    error = form.locator(".form-error")
    wait_for(lambda: error.is_visible(), what="the refusal next to the form")
    assert "max steps: expected a whole number or 'none', got 'many'" in error.inner_text()

    form.locator("input[name=max_steps]").fill("200")
    form.get_by_role("button", name="Set budgets").click()
    wait_for(
        lambda: AgentSession.objects.get(id=session.id).status == "queued",
        what="the session queued again",
    )
    session = run_inline(AgentSession.objects.get(id=session.id))
    assert session.status == "completed", session.last_error
    page.reload()
    assert "6" in page.locator(".answer-box").inner_text()
    assert "set budgets: max_steps=200" in page.locator("#trace").inner_text()
    # The one HTTP error was the refused form (400), shown beside it.
    assert console_errors(page, allow_http_errors=True) == []
    assert len(page.console_errors) == 1
    page.console_errors.clear()

    page.click("nav >> text=Costs")
    page.wait_for_url("**/sessions/costs/")
    page.select_option("select[name=group]", "agent")
    page.get_by_role("button", name="Show").click()
    page.wait_for_url("**group=agent**")
    rows = page.locator("#costs-table tbody tr")
    assert sorted(r.get_attribute("data-key") for r in rows.all()) == ["demo", "slow"]
    demo_cost = page.locator("#costs-table tr[data-key=demo] td.num").first.inner_text()
    assert float(demo_cost) == pytest.approx(float(done.cost), rel=1e-3)
    assert page.locator("#cost-total").is_visible()
    screenshot(page, "costs-by-agent")
    assert console_errors(page) == []
