"""An action the server refuses is told to the operator even when the live page redraws the
part that held its button (the session moved on meanwhile: often the very reason)."""

from __future__ import annotations

import pytest

from sessions_app.services.core import session_cancel, session_start

from .conftest import console_errors, login, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("width", [390, 1400])
def test_a_refused_cancel_is_told_after_the_page_redrew_its_button(make_page, users, width):
    session = session_start(agent="slow", input="count to 50", actor=users["operator"])
    page = make_page(width, 900, accept_dialogs=True)
    login(page, "olivia", "pw-operator")
    page.goto(f"/sessions/{session.id}/")
    page.evaluate("window.__noReload = true")
    # Someone else cancels it while this page still offers Cancel.
    session_cancel(session_id=session.id, actor=users["operator"])
    page.click("#actions button:has-text('Cancel')")
    toast = page.locator("#toast")
    toast.wait_for(state="visible", timeout=5000)
    assert "already cancelled" in toast.inner_text()
    # Once the page has redrawn the actions, the refusal is still on screen.
    page.locator("#actions button:has-text('Cancel')").wait_for(state="detached", timeout=10_000)
    assert toast.is_visible() and "already cancelled" in toast.inner_text()
    screenshot(page, f"refused-cancel-{width}", full_page=False)
    # It covers what is below it: a tap dismisses it, and so does Escape.
    toast.click()
    toast.wait_for(state="hidden", timeout=2000)
    page.evaluate(
        "document.body.dispatchEvent(new CustomEvent('respawn-notice', {detail: {text: 'again'}}))"
    )
    toast.wait_for(state="visible", timeout=2000)
    page.keyboard.press("Escape")
    toast.wait_for(state="hidden", timeout=2000)
    assert console_errors(page, allow_http_errors=True) == []
