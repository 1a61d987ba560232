"""Alerts in a real browser: an operator creates a webhook rule (a bad URL refused next to
the form first), copies the secret shown once, watches the delivery log fill in as the
workers' sender delivers an alert and a test; a viewer reads the rules but gets no form."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sessions_app.models import AlertRule
from sessions_app.services.core import session_start
from sessions_app.store.alerts import forget_rules
from sessions_app.upkeep import alerts

from ..conftest import run_inline, wait_for
from ..stubs.webhooks import Receiver
from .conftest import console_errors, login, screenshot

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from alert_receiver import verify  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def receiver():
    made = Receiver()
    forget_rules()
    yield made
    made.close()
    forget_rules()


def test_an_operator_creates_a_rule_and_watches_its_deliveries(page, users, receiver):
    login(page, "olivia", "pw-operator")
    page.click("nav >> text=Alerts")
    page.wait_for_url("**/sessions/alerts/")
    assert "No rules yet" in page.locator("#alert-rules").inner_text()

    form = page.locator("#new-rule")
    form.locator("input[name=name]").fill("on-call")
    form.locator("input[name=agent]").fill("approval")
    form.locator("select[name=channel]").select_option("webhook")
    form.locator("input[name=target]").fill("ftp://127.0.0.1/hook")
    form.get_by_role("button", name="Create rule").click()
    error = page.locator("#rule-error")
    wait_for(error.is_visible, what="the refusal next to the form")
    assert "must start with http:// or https://" in error.inner_text()
    form = page.locator("#new-rule")
    assert form.locator("input[name=name]").input_value() == "on-call"
    assert form.locator("input[name=reasons][value=approval]").is_checked()

    form.locator("input[name=target]").fill(receiver.url)
    form.get_by_role("button", name="Create rule").click()
    shown = page.locator("#rule-secret code.secret")
    wait_for(shown.is_visible, what="the secret, shown once")
    secret = shown.inner_text().strip()
    assert secret.startswith("whsec_")
    screenshot(page, "alert-rule-created")
    rule = AlertRule.objects.get()

    # The session starts to wait; the log shows the alert queued, then delivered, by itself.
    session = run_inline(session_start(agent="approval", input="pay invoice 9"))
    assert session.status == "waiting_input"
    page.goto(f"/sessions/alerts/{rule.id}/")
    assert secret not in page.content()  # never again
    log = page.locator("#delivery-log")
    assert "Pending" in log.inner_text() and "waiting for approval" in log.inner_text()
    assert alerts.deliver_due() == {"delivered": 1}
    wait_for(lambda: "Delivered" in log.inner_text(), timeout=10, what="the log to redraw")
    row = log.locator("tr.delivery").first
    assert "200" in row.inner_text() and str(session.id)[:8] in row.inner_text()

    page.get_by_role("button", name="Send a test").click()
    page.wait_for_url(f"**/sessions/alerts/{rule.id}/")
    assert "A test message is queued" in page.locator(".messages").inner_text()
    assert alerts.deliver_due() == {"delivered": 1}
    log = page.locator("#delivery-log")
    wait_for(
        lambda: "Pending" not in log.inner_text() and log.inner_text().count("Delivered") == 2,
        timeout=10,
        what="the test's delivery in the log",
    )
    screenshot(page, "alert-delivery-log")
    headers, body, _ = receiver.requests[-1]
    verify(secret, body, headers["Respawn-Signature"])  # the secret the page showed
    assert json.loads(body)["type"] == "alert.test"

    page.get_by_role("button", name="Switch off").click()
    page.wait_for_url(f"**/sessions/alerts/{rule.id}/")
    assert page.locator("h1 .badge").inner_text() == "off"
    assert console_errors(page, allow_http_errors=True) == []


def test_a_viewer_reads_rules_and_logs_but_cannot_change_them(page, users, receiver):
    from sessions_app.services.alerts import alert_rule_create

    rule, _ = alert_rule_create(
        name="on-call", agent="", reasons=["failed"], channel="webhook", target=receiver.url
    )
    login(page, "victor", "pw-viewer")
    page.goto("/sessions/alerts/")
    assert "on-call" in page.locator("#alert-rules").inner_text()
    assert page.locator("#new-rule").count() == 0
    assert "Only operators and admins" in page.content()
    page.click("#alert-rules >> text=on-call")
    page.wait_for_url(f"**/sessions/alerts/{rule.id}/")
    assert page.get_by_role("button", name="Send a test").count() == 0
    assert "Nothing sent yet" in page.locator("#delivery-log").inner_text()
    assert console_errors(page) == []
