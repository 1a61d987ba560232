"""Alerts in one process: the outbox rows a change writes, sending to real receivers on
loopback (a webhook server, a Slack-compatible one, an SMTP server), retries, timeouts,
signatures checked with the documented recipe, "resolved" messages and the rules' checks."""

from __future__ import annotations

import json
import socketserver
import sys
import threading
import time
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.utils import timezone

from sessions_app.models import (
    AgentSession,
    AlertDelivery,
    AlertEvent,
    AuditEvent,
    DeliveryStatus,
    Status,
)
from sessions_app.services.alerts import (
    alert_rule_create,
    alert_rule_send_test,
    alert_rule_set_enabled,
)
from sessions_app.services.core import ActionError, session_approve, session_start
from sessions_app.store.alerts import forget_rules
from sessions_app.upkeep import alerts
from tests.conftest import run_inline
from tests.servers import free_port
from tests.stubs.webhooks import Receiver

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from alert_receiver import BadSignature, verify  # noqa: E402  (the documented recipe)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def receivers():
    made: list[Receiver] = []

    def make(*args, **kwargs) -> Receiver:
        made.append(Receiver(*args, **kwargs))
        return made[-1]

    yield make
    for receiver in made:
        receiver.close()


@pytest.fixture(autouse=True)
def _fresh_rules():
    forget_rules()
    yield
    forget_rules()


def webhook_rule(url: str, reasons=("approval",), agent: str = "approval", **kwargs):
    return alert_rule_create(
        name="pager", agent=agent, reasons=list(reasons), channel="webhook", target=url, **kwargs
    )


def waiting_for_approval() -> AgentSession:
    session = session_start(agent="approval", input="pay invoice 9")
    run_inline(session)
    assert session.status == Status.WAITING_INPUT
    return session


def make_due() -> None:
    AlertDelivery.objects.exclude(status=DeliveryStatus.DELIVERED).update(
        next_attempt_at=timezone.now() - timedelta(seconds=1)
    )


def test_waiting_for_approval_writes_the_delivery_with_the_append(receivers):
    rule, secret = webhook_rule("http://127.0.0.1:1/hook")
    assert secret.startswith("whsec_")
    session = waiting_for_approval()
    (delivery,) = AlertDelivery.objects.all()
    assert delivery.rule == rule and delivery.kind == "fired"
    assert delivery.event.session_id == session.id and delivery.event.reason == "approval"
    assert delivery.status == DeliveryStatus.PENDING
    # The sweep sees the same state and raises nothing more: one event, one delivery.
    alerts.sweep()
    assert AlertDelivery.objects.count() == 1 and AlertEvent.objects.count() == 1


def test_no_rule_no_rows_and_other_agents_do_not_match():
    webhook_rule("http://127.0.0.1:1/hook", agent="another-agent")
    waiting_for_approval()
    alerts.sweep()
    assert not AlertEvent.objects.exists() and not AlertDelivery.objects.exists()


def test_signed_webhook_verifies_with_the_recipe_and_a_wrong_secret_fails(receivers):
    receiver = receivers()
    _, secret = webhook_rule(receiver.url)
    session = waiting_for_approval()
    assert alerts.deliver_due() == {"delivered": 1}
    ((headers, body, code),) = receiver.requests
    verify(secret, body, headers["Respawn-Signature"])
    with pytest.raises(BadSignature, match="does not match"):
        verify(secret + "x", body, headers["Respawn-Signature"])
    with pytest.raises(BadSignature, match="does not match"):
        verify(secret, body.replace(b"approval", b"approvaL"), headers["Respawn-Signature"])
    with pytest.raises(BadSignature, match="tolerance"):
        verify(secret, body, headers["Respawn-Signature"], now=time.time() + 3600)
    alert = json.loads(body)
    assert alert["type"] == "alert.fired" and alert["reason"] == "approval"
    assert alert["session"]["id"] == str(session.id)
    assert alert["session"]["url"].endswith(f"/sessions/{session.id}/")
    delivery = AlertDelivery.objects.get()
    assert headers["Respawn-Delivery"] == str(delivery.uid) == alert["id"]
    assert (delivery.status, delivery.response_code, delivery.attempts) == ("delivered", 200, 1)
    # Delivered: never sent again, however often the workers look.
    make_due()
    assert alerts.deliver_due() == {}
    assert len(receiver.requests) == 1


def test_500_then_200_retries_with_backoff_and_delivers_once(receivers, settings):
    settings.RESPAWN_ALERT_BACKOFF = settings.RESPAWN_ALERT_BACKOFF_MAX = 30
    receiver = receivers(codes=(500, 200))
    webhook_rule(receiver.url)
    waiting_for_approval()
    assert alerts.deliver_due() == {"retrying": 1}
    delivery = AlertDelivery.objects.get()
    assert (delivery.status, delivery.response_code, delivery.attempts) == ("retrying", 500, 1)
    assert "HTTP 500" in delivery.last_error
    # Backoff: not due before its time.
    assert delivery.next_attempt_at > timezone.now() + timedelta(seconds=20)
    assert alerts.deliver_due() == {}
    make_due()
    assert alerts.deliver_due() == {"delivered": 1}
    delivery.refresh_from_db()
    assert (delivery.status, delivery.response_code, delivery.attempts) == ("delivered", 200, 2)
    assert receiver.accepted() == [str(delivery.uid)]
    assert len(receiver.requests) == 2


def test_gives_up_after_max_attempts(receivers, settings):
    settings.RESPAWN_ALERT_MAX_ATTEMPTS = 2
    receiver = receivers(codes=(503,))
    webhook_rule(receiver.url)
    waiting_for_approval()
    assert alerts.deliver_due() == {"retrying": 1}
    make_due()
    assert alerts.deliver_due() == {"gave_up": 1}
    make_due()
    assert alerts.deliver_due() == {}
    assert AlertDelivery.objects.get().status == DeliveryStatus.GAVE_UP


def test_a_hanging_receiver_holds_a_send_for_its_timeout_only(receivers, settings):
    settings.RESPAWN_ALERT_TIMEOUT = 0.5
    receiver = receivers(delay=5)
    webhook_rule(receiver.url)
    waiting_for_approval()
    started = time.monotonic()
    assert alerts.deliver_due() == {"retrying": 1}
    assert time.monotonic() - started < 2.5
    assert "Timeout" in AlertDelivery.objects.get().last_error


def test_a_receiver_that_is_down_is_retried(receivers):
    port = free_port()
    webhook_rule(f"http://127.0.0.1:{port}/hook")
    waiting_for_approval()
    assert alerts.deliver_due() == {"retrying": 1}
    assert "ConnectionError" in AlertDelivery.objects.get().last_error
    receiver = receivers(port=port)
    make_due()
    assert alerts.deliver_due() == {"delivered": 1}
    assert len(receiver.accepted()) == 1


def test_resolved_follows_when_the_session_leaves_the_state(receivers, users):
    receiver = receivers()
    webhook_rule(receiver.url)
    session = waiting_for_approval()
    alerts.deliver_due()
    session_approve(session_id=session.id, actor=users["operator"])
    assert alerts.sweep() == (0, 1)
    assert alerts.sweep() == (0, 0)
    assert alerts.deliver_due() == {"delivered": 1}
    kinds = [json.loads(body)["type"] for _, body, _ in receiver.requests]
    assert kinds == ["alert.fired", "alert.resolved"]
    assert AlertEvent.objects.get().resolved_at is not None


def test_the_sweep_raises_what_no_append_announced(receivers):
    """A rule created after the session started waiting (within the rules cache, another
    process's append did not see it) is raised by the sweep."""
    session = waiting_for_approval()
    AgentSession.objects.filter(id=session.id).update(updated_at=timezone.now())
    webhook_rule("http://127.0.0.1:1/hook")
    assert not AlertDelivery.objects.exists()
    assert alerts.sweep() == (1, 0)
    assert AlertDelivery.objects.get().event.session_id == session.id


def test_stuck_is_raised_by_the_sweep(settings):
    settings.RESPAWN_ALERT_STUCK_AFTER = 1
    webhook_rule("http://127.0.0.1:1/hook", reasons=["stuck"], agent="")
    session = session_start(agent="echo", input="hello")
    long_ago = timezone.now() - timedelta(minutes=5)
    AgentSession.objects.filter(id=session.id).update(
        status=Status.RUNNING, lease_owner="dead", lease_expires_at=long_ago, updated_at=long_ago
    )
    assert alerts.sweep() == (1, 0)
    assert AlertEvent.objects.get().reason == "stuck"
    AgentSession.objects.filter(id=session.id).update(status=Status.CANCELLED)
    assert alerts.sweep() == (0, 1)


def test_a_session_waiting_past_its_target_is_raised_and_resolved_once_someone_acts(settings):
    """The work queue's targets (RESPAWN_ATTENTION_TARGETS): a session that has waited for
    a person longer than its section's target is raised by the sweep, however long ago it
    began waiting; it is resolved once it is no longer past target (someone acted)."""
    settings.RESPAWN_ATTENTION_TARGETS = '{"approvals": 600}'
    webhook_rule("http://127.0.0.1:1/hook", reasons=["past_target"])
    fresh = waiting_for_approval()
    late = waiting_for_approval()
    long_ago = timezone.now() - timedelta(hours=3)
    AgentSession.objects.filter(id=late.id).update(updated_at=long_ago)
    assert alerts.sweep() == (1, 0)
    event = AlertEvent.objects.get()
    assert (event.session_id, event.reason) == (late.id, "past_target")
    assert AlertDelivery.objects.filter(event=event).count() == 1
    assert alerts.sweep() == (0, 0)  # raised once
    AgentSession.objects.filter(id=late.id).update(updated_at=timezone.now())  # acted on
    assert alerts.sweep() == (0, 1)
    assert not AlertEvent.objects.filter(session_id=fresh.id).exists()


def test_a_disabled_rule_sends_nothing():
    rule, _ = webhook_rule("http://127.0.0.1:1/hook")
    alert_rule_set_enabled(rule=rule, enabled=False)
    waiting_for_approval()
    alerts.sweep()
    assert not AlertDelivery.objects.exists()


def test_slack_message(receivers):
    receiver = receivers()
    alert_rule_create(
        name="chat", agent="", reasons=["approval"], channel="slack", target=receiver.url
    )
    waiting_for_approval()
    assert alerts.deliver_due() == {"delivered": 1}
    ((headers, body, _),) = receiver.requests
    text = json.loads(body)["text"]
    assert "waiting for approval" in text and "/sessions/" in text
    assert "Respawn-Signature" not in headers


class SMTPHandler(socketserver.StreamRequestHandler):
    """Just enough SMTP to accept a message."""

    def reply(self, line: str) -> None:
        self.wfile.write(line.encode() + b"\r\n")

    def handle(self) -> None:
        self.reply("220 localhost test SMTP")
        data_mode, lines = False, []
        while True:
            raw = self.rfile.readline()
            if not raw:
                return
            line = raw.decode(errors="replace").rstrip("\r\n")
            if data_mode:
                if line == ".":
                    self.server.messages.append("\n".join(lines))  # type: ignore[attr-defined]
                    data_mode, lines = False, []
                    self.reply("250 OK")
                else:
                    lines.append(line)
                continue
            verb = line.split(" ")[0].upper()
            if verb in ("EHLO", "HELO"):
                self.reply("250 localhost")
            elif verb == "DATA":
                data_mode = True
                self.reply("354 go ahead")
            elif verb == "QUIT":
                self.reply("221 bye")
                return
            else:
                self.reply("250 OK")


def test_email_through_djangos_mail_settings(settings):
    server = socketserver.ThreadingTCPServer(("127.0.0.1", free_port()), SMTPHandler)
    server.daemon_threads = True
    server.messages = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", server.server_address[1]
        alert_rule_create(
            name="mail",
            agent="approval",
            reasons=["approval"],
            channel="email",
            target="oncall@example.com, lead@example.com",
        )
        waiting_for_approval()
        assert alerts.deliver_due() == {"delivered": 1}
        (mail,) = server.messages  # type: ignore[attr-defined]
        assert "waiting for approval" in mail and "oncall@example.com" in mail
    finally:
        server.shutdown()
        server.server_close()


def test_send_a_test(receivers, users):
    receiver = receivers()
    rule, secret = webhook_rule(receiver.url)
    alert_rule_send_test(rule=rule, actor=users["operator"])
    assert alerts.deliver_due() == {"delivered": 1}
    ((headers, body, _),) = receiver.requests
    verify(secret, body, headers["Respawn-Signature"])
    assert json.loads(body)["type"] == "alert.test"
    assert AuditEvent.objects.filter(action="alert_rule_test", actor=users["operator"]).exists()


@pytest.mark.parametrize(
    "channel,target,message",
    [
        ("webhook", "ftp://example.com/x", "must start with http:// or https://"),
        ("webhook", "javascript:alert(1)", "must start with http:// or https://"),
        ("webhook", "http:///nohost", "no host name"),
        ("webhook", "http://example.com:99999999/", "cannot be read"),
        ("slack", "example.com/hook", "must start with http"),
        ("email", "not-an-address", "is not an e-mail address"),
        ("pager", "http://example.com/", "unknown channel"),
    ],
)
def test_bad_targets_are_refused_clearly(channel, target, message):
    with pytest.raises(ActionError, match=message):
        alert_rule_create(name="x", agent="", reasons=["approval"], channel=channel, target=target)
    assert not AuditEvent.objects.exists()


def test_unknown_or_missing_reasons_are_refused():
    with pytest.raises(ActionError, match="unknown reason 'bored'"):
        webhook_rule("http://example.com/", reasons=["bored"])
    with pytest.raises(ActionError, match="at least one reason"):
        webhook_rule("http://example.com/", reasons=[])


def test_the_secret_is_stored_encrypted_and_audited_without_it():
    rule, secret = webhook_rule("http://example.com/hook?token=abc")
    rule.refresh_from_db()
    assert secret.encode() not in bytes(rule.secret_box)
    assert alerts.rule_secret(rule) == secret
    event = AuditEvent.objects.get(action="alert_rule_create")
    assert secret not in json.dumps(event.after)
    assert "abc" not in json.dumps(event.after)  # the query string is masked


def test_send_alerts_command(receivers):
    from django.core.management import call_command

    receiver = receivers()
    webhook_rule(receiver.url)
    waiting_for_approval()
    out = StringIO()
    call_command("send_alerts", stdout=out)
    assert out.getvalue().strip() == "raised 0, resolved 0; sent: 1 delivered"
    assert len(receiver.accepted()) == 1
