"""Alerts: rules that tell a person when a session needs one, the alert events that open
(and resolve) per session and reason, and the outbox of deliveries the workers send.

A delivery row is written in the same transaction as the change that causes it (the
store's append of a waiting, paused or failed session; the late-call audit record; the
alert sweep's own observation of a stuck session), so a committed change always has its
delivery rows, and a rolled-back one never has. The workers send them
(sessions_app.upkeep.alerts); docs/RELIABILITY.md says what that guarantees."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from ..redaction import ScrubbedCharField, ScrubbedTextField


class AlertReason(models.TextChoices):
    APPROVAL = "approval", "waiting for approval"
    UNCERTAIN = "uncertain", "uncertain call"
    BUDGET = "budget", "budget reached"
    ANSWER = "answer", "waiting for an answer"
    STUCK = "stuck", "stuck"
    FAILED = "failed", "failed"
    FAILED_CALLS = "failed_calls", "completed with failed calls"
    LATE_CALL = "late_call", "late tool call"
    INCOMPATIBLE = "incompatible", "incompatible after a deploy"
    PAST_TARGET = "past_target", "waiting for a person past its target"


# Reasons that are a one-off notice, not a state a session stays in: no "resolved" follows.
NOTICE_REASONS = (AlertReason.LATE_CALL,)


class AlertChannel(models.TextChoices):
    WEBHOOK = "webhook", "Webhook (signed JSON)"
    SLACK = "slack", "Slack-compatible incoming webhook"
    EMAIL = "email", "E-mail"


class AlertRule(models.Model):
    """Where to send alerts of some reasons, for one agent or for every agent. The secret
    (webhooks only) is shown once, when the rule is created, and stored encrypted under the
    project's seal keys (sessions_app.sealing)."""

    name = ScrubbedCharField(max_length=100)
    # "" = every agent.
    agent = models.CharField(max_length=100, blank=True, default="")
    # The reasons, comma-separated with a comma at each end (",approval,stuck,"): a rule
    # matches a reason with one LIKE that both PostgreSQL and SQLite run.
    reasons = models.CharField(max_length=300)
    channel = models.CharField(max_length=20, choices=AlertChannel.choices)
    # A URL (webhook, Slack) or comma-separated e-mail addresses.
    target = models.CharField(max_length=2000)
    secret_key_id = models.CharField(max_length=20, blank=True, default="")
    secret_box = models.BinaryField(blank=True, default=b"")
    enabled = models.BooleanField(default=True)
    send_resolved = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name", "id"]

    def __str__(self) -> str:
        return self.name

    @property
    def reason_list(self) -> list[str]:
        return [r for r in self.reasons.split(",") if r]

    @property
    def reason_labels(self) -> list[str]:
        labels = dict(AlertReason.choices)
        return [str(labels.get(r, r)) for r in self.reason_list]

    @staticmethod
    def reasons_field(reasons: list[str]) -> str:
        return "," + ",".join(reasons) + ","

    @staticmethod
    def matching_q(reason: str, agent: str) -> Q:
        return Q(enabled=True, reasons__contains=f",{reason},") & (Q(agent="") | Q(agent=agent))

    @property
    def shown_target(self) -> str:
        """The target as pages show it: a Slack URL's path is its secret, a webhook URL's
        query string may hold one; e-mail addresses are shown."""
        if self.channel == AlertChannel.EMAIL:
            return self.target
        from urllib.parse import urlsplit

        parts = urlsplit(self.target)
        path = parts.path
        if self.channel == AlertChannel.SLACK:
            path = path[:10] + "…" if len(path) > 10 else path
        return f"{parts.scheme}://{parts.netloc}{path}" + ("?…" if parts.query else "")


class AlertEvent(models.Model):
    """One session in one alerting state: opened when it enters it, resolved when it
    leaves. At most one open event per session and reason (the unique index): an event
    is raised once, however many times the change or the sweep sees it."""

    session = models.ForeignKey("sessions_app.AgentSession", on_delete=models.CASCADE)
    agent = models.CharField(max_length=100)
    reason = models.CharField(max_length=20, choices=AlertReason.choices)
    detail = ScrubbedTextField(blank=True, default="")
    opened_at = models.DateTimeField(default=timezone.now)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["session", "reason"],
                condition=Q(resolved_at__isnull=True),
                name="alert_event_one_open",
            )
        ]
        indexes = [
            # The sweep's resolution pass: open events of a reason.
            models.Index(
                fields=["reason", "id"],
                name="alert_event_open",
                condition=Q(resolved_at__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.reason} {self.session_id}"


class DeliveryKind(models.TextChoices):
    FIRED = "fired", "Alert"
    RESOLVED = "resolved", "Resolved"
    TEST = "test", "Test"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    SENDING = "sending", "Sending"
    RETRYING = "retrying", "Retrying"
    DELIVERED = "delivered", "Delivered"
    GAVE_UP = "gave_up", "Gave up"


DUE_STATUSES = (DeliveryStatus.PENDING, DeliveryStatus.RETRYING, DeliveryStatus.SENDING)


class AlertDelivery(models.Model):
    """The outbox: one message of one rule about one event (or a test). A worker claims it
    with a token and a time limit; a worker killed while sending leaves it claimed until
    that limit passes, and the next claim sends it again. Once delivered it is never sent
    again (every claim requires a status other than delivered)."""

    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="deliveries")
    event = models.ForeignKey(AlertEvent, null=True, blank=True, on_delete=models.CASCADE)
    kind = models.CharField(max_length=10, choices=DeliveryKind.choices)
    status = models.CharField(
        max_length=10, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    # While sending: the claim's token, and next_attempt_at is the claim's time limit.
    claim_token = models.UUIDField(null=True, blank=True)
    response_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = ScrubbedTextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # One message per rule, event and kind: never two alerts for one event.
            models.UniqueConstraint(
                fields=["rule", "event", "kind"],
                condition=Q(event__isnull=False),
                name="alert_delivery_once",
            )
        ]
        indexes = [
            # The workers' claim: due rows, oldest due first.
            models.Index(
                fields=["next_attempt_at"],
                name="alert_delivery_due",
                condition=Q(status__in=["pending", "retrying", "sending"]),
            ),
            # A rule's delivery log, newest first.
            models.Index(fields=["rule", "-id"], name="alert_delivery_log"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.uid} ({self.status})"
