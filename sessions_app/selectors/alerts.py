"""Reads for alerts: which sessions are in each alerting state now (the sweep raises and
resolves by them), the rules page and a rule's delivery log."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, F, QuerySet
from django.db.models.fields.json import KT

from ..models import (
    AgentSession,
    AlertDelivery,
    AlertReason,
    AlertRule,
    Checkpoint,
    DeliveryStatus,
    Status,
)
from ..permissions import EVERYTHING, Scope
from .core import past_target_q, program_agents

DELIVERY_PAGE = 50


def _head_has(path: str) -> QuerySet[Any, Any]:
    """Ids of sessions whose head checkpoint holds a value at `path` (the state is json,
    not jsonb, on PostgreSQL: KT, as "needs attention" reads it)."""
    return (
        Checkpoint.objects.alias(found=KT(path))
        .filter(seq=F("session__head"), found__isnull=False)
        .values("session_id")
    )


def reason_sessions(reason: str, now: datetime) -> QuerySet[AgentSession]:
    """The sessions in the state `reason` names, now (the definitions "needs attention"
    uses, without its display windows)."""
    waiting = AgentSession.objects.filter(status=Status.WAITING_INPUT)
    uncertain = _head_has("state__uncertain_calls__0")
    approval = _head_has("state__pending_approval__call_id")
    if reason == AlertReason.UNCERTAIN:
        return waiting.filter(id__in=uncertain)
    if reason == AlertReason.APPROVAL:
        return waiting.filter(id__in=approval).exclude(id__in=uncertain)
    if reason == AlertReason.ANSWER:
        # A program's own thread waits for its program, not for a person.
        return (
            waiting.exclude(id__in=uncertain)
            .exclude(id__in=approval)
            .exclude(agent__in=program_agents())
        )
    if reason == AlertReason.BUDGET:
        return AgentSession.objects.filter(AgentSession.paused_by_budget_q())
    if reason == AlertReason.STUCK:
        since = now - timedelta(seconds=settings.RESPAWN_ALERT_STUCK_AFTER)
        return AgentSession.objects.filter(AgentSession.stuck_q(now), updated_at__lt=since)
    if reason == AlertReason.FAILED:
        return AgentSession.objects.filter(status=Status.FAILED)
    if reason == AlertReason.FAILED_CALLS:
        return AgentSession.objects.filter(status=Status.COMPLETED, failed_calls__gt=0)
    if reason == AlertReason.INCOMPATIBLE:
        return AgentSession.objects.filter(incompatible_at__isnull=False)
    if reason == AlertReason.PAST_TARGET:
        return AgentSession.objects.filter(past_target_q(now))
    return AgentSession.objects.none()


def _rules(scope: Scope) -> QuerySet[AlertRule]:
    """The rules of the agents in `scope`. A rule for every agent ("") is in a scope that
    is everything only: it speaks of every team's sessions."""
    return AlertRule.objects.filter(scope.q("agent"))


def alert_rules(scope: Scope = EVERYTHING) -> list[AlertRule]:
    """The rules in `scope`, with their deliveries counted by status."""
    rules = list(_rules(scope))
    counts: dict[int, dict[str, int]] = {}
    for row in (
        AlertDelivery.objects.filter(rule__in=rules)
        .values("rule_id", "status")
        .annotate(n=Count("id"))
        .order_by()
    ):
        counts.setdefault(row["rule_id"], {})[row["status"]] = row["n"]
    for rule in rules:
        by_status = counts.get(rule.id, {})
        rule.delivered_count = by_status.get(DeliveryStatus.DELIVERED, 0)  # type: ignore[attr-defined]
        rule.gave_up_count = by_status.get(DeliveryStatus.GAVE_UP, 0)  # type: ignore[attr-defined]
        rule.waiting_count = sum(  # type: ignore[attr-defined]
            n
            for s, n in by_status.items()
            if s not in (DeliveryStatus.DELIVERED, DeliveryStatus.GAVE_UP)
        )
    return rules


def alert_rule(rule_id: int, scope: Scope = EVERYTHING) -> AlertRule | None:
    """The rule, if it is in `scope` (None otherwise, whether it exists or not)."""
    return _rules(scope).filter(id=rule_id).first()


def delivery_log(
    rule: AlertRule, *, before: int | None = None, size: int = DELIVERY_PAGE
) -> tuple[list[AlertDelivery], bool]:
    """A rule's deliveries, newest first, a page before delivery id `before`."""
    rows = AlertDelivery.objects.filter(rule=rule).select_related("event").order_by("-id")
    if before is not None:
        rows = rows.filter(id__lt=before)
    page = list(rows[: size + 1])
    return page[:size], len(page) > size
