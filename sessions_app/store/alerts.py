"""The alert outbox's writes: an alert event and its delivery rows, inserted in the
transaction of the change that raises them.

A session reaching a state a person should hear about (waiting for an approval, paused by
a budget, failed, ...) is written by the store's append; `raise_alert`, called inside the
same transaction, inserts one open AlertEvent and one pending AlertDelivery per matching
rule. Nothing is sent here: the workers send due deliveries (sessions_app.upkeep.alerts).

Sessions without rules pay nearly nothing: whether any enabled rule exists is cached per
process for RESPAWN_ALERT_RULES_CACHE seconds, and with none the append does no extra
statement. A rule created within that time may miss a change in another process: the
workers' alert sweep raises it from the session's state within seconds (upkeep.alerts).
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models.functions import Now
from django.utils import timezone

from agent_runtime.loop import BUDGET_REACHED
from agent_runtime.state import NewCheckpoint, SessionStatus

from ..models import AlertDelivery, AlertEvent, AlertReason, AlertRule, DeliveryKind

_rules_cache: tuple[float, bool] | None = None


def rules_exist() -> bool:
    """Whether any enabled rule exists (cached for RESPAWN_ALERT_RULES_CACHE seconds)."""
    global _rules_cache
    now = time.monotonic()
    if _rules_cache is not None and _rules_cache[0] > now:
        return _rules_cache[1]
    exists = AlertRule.objects.filter(enabled=True).exists()
    _rules_cache = (now + settings.RESPAWN_ALERT_RULES_CACHE, exists)
    return exists


def forget_rules() -> None:
    """Drop the cached answer of rules_exist (a rule was created, switched or deleted)."""
    global _rules_cache
    _rules_cache = None


def append_reason(
    status: SessionStatus | None, checkpoint: NewCheckpoint | None, error: str | None
) -> AlertReason | None:
    """The alert an append with this status raises, if any. A waiting session's reason is
    read from the checkpoint written with it; without one the sweep decides."""
    if status == SessionStatus.FAILED:
        return AlertReason.FAILED
    if status == SessionStatus.PAUSED and (error or "").startswith(BUDGET_REACHED):
        return AlertReason.BUDGET
    if status == SessionStatus.WAITING_INPUT and checkpoint is not None:
        if checkpoint.state.uncertain_calls:
            return AlertReason.UNCERTAIN
        if checkpoint.state.pending_approval is not None:
            return AlertReason.APPROVAL
        return AlertReason.ANSWER
    return None


def raise_alert(session_id: Any, reason: str, *, agent: str | None = None, detail: str = "") -> int:
    """Open an event for the session and reason and queue a delivery per matching rule,
    in the caller's transaction (a savepoint of it). Nothing when no rule matches or the
    event is open already. Returns how many deliveries were queued."""
    if agent is None:
        from ..models import AgentSession

        agent = AgentSession.objects.filter(id=session_id).values_list("agent", flat=True).first()
        if agent is None:
            return 0
    rules = list(
        AlertRule.objects.filter(AlertRule.matching_q(reason, agent)).values_list("id", flat=True)
    )
    if not rules:
        return 0
    now = timezone.now()
    notice = reason == AlertReason.LATE_CALL
    try:
        with transaction.atomic():
            event = AlertEvent.objects.create(
                session_id=session_id,
                agent=agent,
                reason=reason,
                detail=detail[:2000],
                opened_at=now,
                # A notice is over when it is said: it never blocks the next one.
                resolved_at=now if notice else None,
            )
    except IntegrityError:
        return 0  # open already: raised once
    AlertDelivery.objects.bulk_create(
        [
            # Due on the database's clock, on which the workers claim.
            AlertDelivery(rule_id=rule, event=event, kind=DeliveryKind.FIRED, next_attempt_at=Now())
            for rule in rules
        ]
    )
    return len(rules)
