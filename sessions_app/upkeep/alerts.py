"""Sending alerts: the workers' side of the outbox (sessions_app.store.alerts writes it).

- `deliver_due` claims due deliveries with SELECT ... FOR UPDATE SKIP LOCKED and marks
  them "sending" under a claim token with a time limit (next_attempt_at), all in one short
  transaction; then sends each outside any transaction, with a short timeout; then records
  the outcome only where the row still carries that token. A worker killed while sending
  leaves its rows "sending" until their time limit passes, when the next claim takes them
  again. A delivered row is never claimed again.
- `sweep` raises alerts for states no append announced (stuck sessions, which are stuck
  by the passing of time; states written by other paths; a rule created a moment ago) and
  resolves the alerts of sessions that left their state, queueing "resolved" messages.

Webhooks are signed as Stripe and GitHub sign theirs: the header
`Respawn-Signature: t=<unix time>,v1=<hex HMAC-SHA256 of "<t>.<body>" under the rule's
secret>`; examples/alert_receiver.py verifies it, and the README says how.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import random
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import requests
from django.conf import settings
from django.core.mail import get_connection, send_mail
from django.db import close_old_connections, transaction
from django.db.models import F, Min
from django.db.models.functions import Now
from django.utils import timezone

from ..models import (
    AgentSession,
    AlertChannel,
    AlertDelivery,
    AlertEvent,
    AlertReason,
    AlertRule,
    DeliveryKind,
    DeliveryStatus,
)
from ..models.alerts import DUE_STATUSES, NOTICE_REASONS
from ..models.clock import database_clock
from ..sealing import decrypt_bytes
from ..selectors.alerts import reason_sessions
from ..store.alerts import raise_alert

log = logging.getLogger("respawn.alerts")

SIGNATURE_HEADER = "Respawn-Signature"
DELIVERY_HEADER = "Respawn-Delivery"
EVENT_HEADER = "Respawn-Event"
SWEEP_BATCH = 200
SWEEP_MARGIN = 60.0  # seconds


def sign(secret: str, body: bytes, timestamp: int) -> str:
    """The Respawn-Signature header's value for `body` sent at `timestamp`."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def rule_secret(rule: AlertRule) -> str:
    if not rule.secret_key_id:
        return ""
    return decrypt_bytes(rule.secret_key_id, bytes(rule.secret_box)).decode()


# --- What is sent -----------------------------------------------------------------------


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def message(delivery: AlertDelivery) -> dict[str, Any]:
    """The JSON a webhook receives (the same facts the Slack and e-mail texts say)."""
    rule = delivery.rule
    event = delivery.event
    body: dict[str, Any] = {
        "id": str(delivery.uid),
        "type": f"alert.{delivery.kind}",
        "rule": {"id": rule.id, "name": rule.name},
        "reason": event.reason if event else None,
        "reason_label": str(AlertReason(event.reason).label) if event else None,
        "event": None,
        "session": None,
    }
    if event is not None:
        body["event"] = {
            "id": event.id,
            "opened_at": _iso(event.opened_at),
            "resolved_at": _iso(event.resolved_at),
            "detail": event.detail,
        }
        row = (
            AgentSession.objects.filter(id=event.session_id).values_list("title", "status").first()
        )
        title, status = row if row is not None else ("", None)
        body["session"] = {
            "id": str(event.session_id),
            "agent": event.agent,
            "title": title,
            "status": status,
            "url": f"{settings.RESPAWN_PUBLIC_URL}/sessions/{event.session_id}/",
        }
    return body


def _text(body: dict[str, Any]) -> tuple[str, str]:
    """A one-line subject and a few lines of text for Slack and e-mail."""
    session = body["session"]
    if session is None:
        subject = f"[Respawn] test alert from rule {body['rule']['name']!r}"
        return subject, "This is a test: the rule's channel works."
    what = "resolved" if body["type"] == "alert.resolved" else body["reason_label"]
    name = session["title"] or session["id"]
    subject = f"[Respawn] {what}: {session['agent']} session {name}"
    lines = [subject, f"Status: {session['status']}", f"Open it: {session['url']}"]
    if body["event"]["detail"]:
        lines.insert(1, f"Detail: {body['event']['detail'][:500]}")
    return subject, "\n".join(lines)


class SendFailed(Exception):
    def __init__(self, text: str, code: int | None = None) -> None:
        super().__init__(text)
        self.code = code


def send(delivery: AlertDelivery) -> int | None:
    """Send one delivery; its HTTP status (None for e-mail). SendFailed when not accepted."""
    rule = delivery.rule
    body = message(delivery)
    timeout = settings.RESPAWN_ALERT_TIMEOUT
    if rule.channel == AlertChannel.EMAIL:
        subject, text = _text(body)
        recipients = [a.strip() for a in rule.target.split(",") if a.strip()]
        try:
            send_mail(
                subject,
                text,
                settings.DEFAULT_FROM_EMAIL,
                recipients,
                connection=get_connection(timeout=timeout),
            )
        except Exception as exc:  # smtplib's and socket's errors alike
            raise SendFailed(f"{type(exc).__name__}: {exc}"[:500]) from exc
        return None
    headers = {"User-Agent": "Respawn-Alerts/1", "Content-Type": "application/json"}
    if rule.channel == AlertChannel.SLACK:
        data = json.dumps({"text": _text(body)[1]}).encode()
    else:
        data = json.dumps(body, separators=(",", ":")).encode()
        headers[DELIVERY_HEADER] = str(delivery.uid)
        headers[EVENT_HEADER] = body["type"]
        headers[SIGNATURE_HEADER] = sign(rule_secret(rule), data, int(time.time()))
    try:
        response = requests.post(
            rule.target,
            data=data,
            headers=headers,
            timeout=(timeout, timeout),
            allow_redirects=False,
        )
    except requests.RequestException as exc:
        raise SendFailed(f"{type(exc).__name__}: {exc}"[:500]) from exc
    if not 200 <= response.status_code < 300:
        raise SendFailed(
            f"HTTP {response.status_code}: {response.text[:200]}", code=response.status_code
        )
    return response.status_code


# --- The outbox -------------------------------------------------------------------------


def claim_limit() -> timedelta:
    """How long a claim lasts: a send's two timeouts and a margin. A killed worker's rows
    are sent again this long after its claim."""
    return timedelta(seconds=2 * settings.RESPAWN_ALERT_TIMEOUT + 2)


@dataclass(frozen=True)
class Claim:
    token: uuid.UUID
    ids: list[int]


def claim_due(limit: int) -> Claim:
    """Take up to `limit` due deliveries (pending, retrying, or sending past their claim's
    time limit), on the database's clock; rows another worker is claiming are skipped."""
    token = uuid.uuid4()
    with transaction.atomic():
        ids = list(
            AlertDelivery.objects.filter(status__in=DUE_STATUSES, next_attempt_at__lte=Now())
            .order_by("next_attempt_at")
            .select_for_update(skip_locked=True)
            .values_list("id", flat=True)[:limit]
        )
        if ids:
            AlertDelivery.objects.filter(id__in=ids).update(
                status=DeliveryStatus.SENDING,
                claim_token=token,
                next_attempt_at=Now() + claim_limit(),
                attempts=F("attempts") + 1,
            )
    return Claim(token, ids)


def backoff(attempts: int) -> float:
    """Seconds before the next attempt after `attempts` failed ones (jittered ±20 %)."""
    base = settings.RESPAWN_ALERT_BACKOFF * 2 ** max(0, attempts - 1)
    return min(settings.RESPAWN_ALERT_BACKOFF_MAX, base) * random.uniform(0.8, 1.2)


def deliver_one(delivery_id: int, token: uuid.UUID) -> str:
    """Send a claimed delivery and record the outcome under its claim; the status."""
    delivery = (
        AlertDelivery.objects.select_related("rule", "event")
        .filter(id=delivery_id, claim_token=token, status=DeliveryStatus.SENDING)
        .first()
    )
    if delivery is None:
        return "lost"  # another worker's claim took it over
    mine = AlertDelivery.objects.filter(
        id=delivery_id, claim_token=token, status=DeliveryStatus.SENDING
    )
    try:
        code = send(delivery)
    except SendFailed as exc:
        gave_up = delivery.attempts >= settings.RESPAWN_ALERT_MAX_ATTEMPTS
        status = DeliveryStatus.GAVE_UP if gave_up else DeliveryStatus.RETRYING
        mine.update(
            status=status,
            response_code=exc.code,
            last_error=str(exc),
            claim_token=None,
            next_attempt_at=Now() + timedelta(seconds=backoff(delivery.attempts)),
        )
        log.warning(
            "alert delivery %s (rule %r) attempt %d failed%s: %s",
            delivery.uid,
            delivery.rule.name,
            delivery.attempts,
            "; gave up" if gave_up else "",
            exc,
        )
        return status
    mine.update(
        status=DeliveryStatus.DELIVERED,
        response_code=code,
        last_error="",
        claim_token=None,
        delivered_at=Now(),
    )
    return DeliveryStatus.DELIVERED


def deliver_due(limit: int = 20) -> dict[str, int]:
    """Claim and send due deliveries one after the other (the worker's courier sends them
    concurrently instead); how many ended in each status."""
    claim = claim_due(limit)
    outcome: dict[str, int] = {}
    for delivery_id in claim.ids:
        status = deliver_one(delivery_id, claim.token)
        outcome[status] = outcome.get(status, 0) + 1
    return outcome


# --- The sweep --------------------------------------------------------------------------


def sweep(now: datetime | None = None) -> tuple[int, int]:
    """Raise the alerts of sessions in an alerting state that have no open event yet, and
    resolve the open events of sessions that left their state. (raised, resolved)"""
    now = now or database_clock()
    raised = resolved = 0
    enabled = AlertRule.objects.filter(enabled=True)
    for reason in AlertReason.values:
        if reason in NOTICE_REASONS:
            continue  # raised only with the audit record that reports it
        rules = enabled.filter(reasons__contains=f",{reason},")
        first = rules.aggregate(first=Min("created_at"))["first"]
        in_state = reason_sessions(reason, now)
        if first is not None:
            candidates = in_state.exclude(
                id__in=AlertEvent.objects.filter(reason=reason, resolved_at__isnull=True).values(
                    "session_id"
                )
            )
            if reason not in (AlertReason.STUCK, AlertReason.PAST_TARGET):
                # Only what happened since the first rule for it (less the time a
                # process may have missed it, RESPAWN_ALERT_RULES_CACHE, and a margin): a
                # new rule does not alert about every session that failed last year.
                margin = timedelta(seconds=settings.RESPAWN_ALERT_RULES_CACHE + SWEEP_MARGIN)
                candidates = candidates.filter(updated_at__gte=first - margin)
            agents = set(rules.values_list("agent", flat=True))
            if "" not in agents:
                candidates = candidates.filter(agent__in=agents)
            for session_id, agent, error in candidates.values_list("id", "agent", "last_error")[
                :SWEEP_BATCH
            ]:
                with transaction.atomic():
                    raised += bool(raise_alert(session_id, reason, agent=agent, detail=error))
        stale = AlertEvent.objects.filter(reason=reason, resolved_at__isnull=True).exclude(
            session_id__in=in_state.values("id")
        )
        for event_id in stale.values_list("id", flat=True)[:SWEEP_BATCH]:
            resolved += resolve_event(event_id)
    return raised, resolved


def resolve_event(event_id: int) -> int:
    """Mark the event resolved and queue a "resolved" message to each rule that was sent
    the alert and wants one, in one transaction (only the first caller does)."""
    with transaction.atomic():
        if not AlertEvent.objects.filter(id=event_id, resolved_at__isnull=True).update(
            resolved_at=timezone.now()
        ):
            return 0
        rules = AlertDelivery.objects.filter(
            event_id=event_id, kind=DeliveryKind.FIRED, rule__send_resolved=True
        ).values_list("rule_id", flat=True)
        AlertDelivery.objects.bulk_create(
            [
                AlertDelivery(
                    rule_id=rule,
                    event_id=event_id,
                    kind=DeliveryKind.RESOLVED,
                    next_attempt_at=Now(),
                )
                for rule in rules
            ],
            ignore_conflicts=True,
        )
    return 1


# --- The courier ------------------------------------------------------------------------


class Courier:
    """The worker's sender: claims as many due deliveries as it has free sending threads,
    and sends each on a thread of its own, which records its outcome. A receiver that
    hangs holds one thread for its timeout; the sessions' jobs never wait for it."""

    def __init__(self, concurrency: int) -> None:
        from concurrent.futures import ThreadPoolExecutor
        from threading import Semaphore

        self.pool = ThreadPoolExecutor(concurrency, thread_name_prefix="respawn-alert")
        self.free = Semaphore(concurrency)
        self.concurrency = concurrency
        self.in_flight = 0

    def _send(self, delivery_id: int, token: uuid.UUID) -> None:
        try:
            close_old_connections()
            deliver_one(delivery_id, token)
        except Exception:
            log.exception("alert delivery %s failed to record", delivery_id)
        finally:
            self.free.release()

    def pass_once(self) -> int:
        """Claim and start sending what the free threads can take; how many started."""
        slots = 0
        while self.free.acquire(blocking=False):
            slots += 1
        if not slots:
            return 0
        try:
            claim = claim_due(slots)
        except Exception:
            for _ in range(slots):
                self.free.release()
            raise
        for _ in range(slots - len(claim.ids)):
            self.free.release()
        for delivery_id in claim.ids:
            self.pool.submit(self._send, delivery_id, claim.token)
        return len(claim.ids)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
