"""The alerts pages: who may read and manage rules, the secret shown once, clear refusals of
bad input, the test button and the delivery log."""

from __future__ import annotations

import pytest
from django.urls import reverse

from sessions_app.models import AlertDelivery, AlertRule, AuditEvent
from sessions_app.services.alerts import alert_rule_create

pytestmark = pytest.mark.django_db

NEW_RULE = {
    "name": "on-call",
    "agent": "approval",
    "reasons": ["approval", "stuck"],
    "channel": "webhook",
    "target": "https://hooks.example.com/respawn?token=abc123",
    "send_resolved": "1",
}


def test_operator_creates_a_rule_and_sees_its_secret_once(client, users):
    client.force_login(users["operator"])
    response = client.post(reverse("sessions:alerts"), NEW_RULE)
    assert response.status_code == 201
    rule = AlertRule.objects.get()
    page = response.content.decode()
    assert 'id="rule-secret"' in page
    secret = page.split('<code class="secret" hx-disable>')[1].split("<")[0]
    assert secret.startswith("whsec_")
    assert rule.reason_list == ["approval", "stuck"] and rule.agent == "approval"
    # Never again: not on its page, not on the list, not in the audit record.
    again = client.get(reverse("sessions:alert_rule", args=[rule.id])).content.decode()
    listing = client.get(reverse("sessions:alerts")).content.decode()
    for shown in (again, listing):
        assert secret not in shown and "abc123" not in shown
        assert "https://hooks.example.com/respawn?…" in shown
    event = AuditEvent.objects.get(action="alert_rule_create", actor=users["operator"])
    assert secret not in str(event.after) and "abc123" not in str(event.after)


def test_viewer_reads_rules_but_may_not_manage_them(client, users):
    rule, _ = alert_rule_create(
        name="r", agent="", reasons=["failed"], channel="webhook", target="http://h.example/"
    )
    client.force_login(users["viewer"])
    assert client.get(reverse("sessions:alerts")).status_code == 200
    assert client.get(reverse("sessions:alert_rule", args=[rule.id])).status_code == 200
    assert client.post(reverse("sessions:alerts"), NEW_RULE).status_code == 403
    for name in ("alert_rule_test", "alert_rule_switch", "alert_rule_delete"):
        response = client.post(reverse(f"sessions:{name}", args=[rule.id]))
        assert response.status_code == 403
        assert "only operators and admins" in response.content.decode()
    assert AlertRule.objects.get().enabled and not AlertDelivery.objects.exists()


def test_outsider_is_refused(client, users):
    client.force_login(users["outsider"])
    assert client.get(reverse("sessions:alerts")).status_code == 403


def test_a_bad_url_is_refused_with_a_clear_error(client, users):
    client.force_login(users["operator"])
    response = client.post(reverse("sessions:alerts"), {**NEW_RULE, "target": "file:///etc/x"})
    assert response.status_code == 400
    page = response.content.decode()
    assert "must start with http:// or https://" in page
    assert 'value="on-call"' in page  # the form keeps what was typed
    assert not AlertRule.objects.exists()


def test_send_a_test_switch_and_delete(client, users):
    rule, _ = alert_rule_create(
        name="r", agent="", reasons=["failed"], channel="webhook", target="http://h.example/"
    )
    client.force_login(users["operator"])
    response = client.post(reverse("sessions:alert_rule_test", args=[rule.id]), follow=True)
    page = response.content.decode()
    assert "A test message is queued" in page
    assert "delivery-pending" in page and 'hx-trigger="every 2s"' in page
    assert AlertDelivery.objects.get().kind == "test"
    client.post(reverse("sessions:alert_rule_switch", args=[rule.id]), {"enabled": "0"})
    assert not AlertRule.objects.get().enabled
    client.post(reverse("sessions:alert_rule_delete", args=[rule.id]))
    assert not AlertRule.objects.exists() and not AlertDelivery.objects.exists()
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {"alert_rule_test", "alert_rule_disable", "alert_rule_delete"} <= actions


def test_the_log_pages_and_refuses_a_bad_cursor(client, users):
    rule, _ = alert_rule_create(
        name="r", agent="", reasons=["failed"], channel="webhook", target="http://h.example/"
    )
    AlertDelivery.objects.bulk_create([AlertDelivery(rule=rule, kind="test") for _ in range(60)])
    client.force_login(users["viewer"])
    page = client.get(reverse("sessions:alert_rule", args=[rule.id])).content.decode()
    assert page.count('class="delivery ') == 50 and "older →" in page
    bad = client.get(reverse("sessions:alert_rule", args=[rule.id]) + "?before=x")
    assert bad.status_code == 400 and "not a whole number" in bad.content.decode()
    missing = client.get(reverse("sessions:alert_rule", args=[9999]))
    assert missing.status_code == 404


def test_the_admin_shows_rules_and_deliveries_without_the_secret(client, users, admin_user):
    rule, secret = alert_rule_create(
        name="r",
        agent="",
        reasons=["failed"],
        channel="slack",
        target="https://h.example/T0/B0/xyzsecret",
    )
    AlertDelivery.objects.create(rule=rule, kind="test")
    client.force_login(admin_user)
    for url in (
        reverse("admin:sessions_app_alertrule_changelist"),
        reverse("admin:sessions_app_alertrule_change", args=[rule.id]),
        reverse("admin:sessions_app_alertdelivery_changelist"),
    ):
        response = client.get(url)
        assert response.status_code == 200, url
        assert "xyzsecret" not in response.content.decode()
    assert client.get(reverse("admin:sessions_app_alertrule_add")).status_code == 403
