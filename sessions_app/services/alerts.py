"""Managing alert rules (an operator's or an admin's action, audited): create one (its
webhook secret generated here and returned once), switch it on or off, delete it, queue a
test message. The messages themselves are sent by the workers (sessions_app.upkeep.alerts).

A person manages the rules of the agents whose sessions they may act on (a team's
operators their team's agents); a rule for every agent takes a global role
(permissions.can_manage_alert_rule). Each service checks it for the person it is given."""

from __future__ import annotations

import secrets
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import transaction
from django.db.models.functions import Now

from ..models import (
    AlertChannel,
    AlertDelivery,
    AlertReason,
    AlertRule,
    AuditAction,
    DeliveryKind,
)
from ..permissions import can_manage_alert_rule, can_operate
from ..sealing import encrypt_bytes
from ..store.alerts import forget_rules
from .core import ActionError, Actor, _actor, audit

MAX_RECIPIENTS = 20


def _check_manage(actor: Actor, agent: str) -> None:
    """Refuse a person who may not manage rules for `agent` (the system may)."""
    user = _actor(actor).user
    if user is None or can_manage_alert_rule(user, agent):
        return
    if not can_operate(user):
        raise ActionError("only operators and admins can manage alert rules", code="forbidden")
    if not agent:
        raise ActionError(
            "a rule for every agent covers every team: it needs a global operator or admin; "
            "name one of your team's agents",
            code="forbidden",
            field="agent",
        )
    raise ActionError(
        f"you may not manage alert rules for the agent {agent[:100]!r}",
        code="forbidden",
        field="agent",
    )


def _url(target: str) -> str:
    """A receiver's URL, checked: http or https, with a host (untrusted input)."""
    if len(target) > 2000:
        raise ActionError("the URL is longer than 2000 characters", field="target")
    try:
        parts = urlsplit(target)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise ActionError(f"the URL cannot be read: {exc}", field="target") from None
    if parts.scheme not in ("http", "https"):
        raise ActionError(
            f"the URL must start with http:// or https:// (not {parts.scheme or 'nothing'!r})",
            field="target",
        )
    if not parts.hostname:
        raise ActionError("the URL has no host name", field="target")
    if any(c.isspace() for c in target):
        raise ActionError("the URL contains a space", field="target")
    return target


def _addresses(target: str) -> str:
    addresses = [a.strip() for a in target.split(",") if a.strip()]
    if not addresses:
        raise ActionError("give at least one e-mail address", field="target")
    if len(addresses) > MAX_RECIPIENTS:
        raise ActionError(f"at most {MAX_RECIPIENTS} addresses", field="target")
    for address in addresses:
        try:
            validate_email(address)
        except ValidationError:
            raise ActionError(
                f"{address[:100]!r} is not an e-mail address", field="target"
            ) from None
    return ", ".join(addresses)


def alert_rule_create(
    *,
    name: str,
    agent: str,
    reasons: list[str],
    channel: str,
    target: str,
    send_resolved: bool = True,
    actor: Actor = None,
    request_meta: dict[str, Any] | None = None,
) -> tuple[AlertRule, str]:
    """A new rule, and its webhook secret ("" for other channels): the only time anyone
    sees the secret. ActionError (naming the field) for bad input."""
    name = (name or "").strip()
    if not name:
        raise ActionError("give the rule a name", field="name")
    if len(name) > 100:
        raise ActionError("the name is longer than 100 characters", field="name")
    agent = (agent or "").strip()
    if len(agent) > 100:
        raise ActionError("the agent name is longer than 100 characters", field="agent")
    _check_manage(actor, agent)
    unknown = [r for r in reasons if r not in AlertReason.values]
    if unknown:
        raise ActionError(f"unknown reason {unknown[0][:50]!r}", field="reasons")
    if not reasons:
        raise ActionError("choose at least one reason", field="reasons")
    if channel not in AlertChannel.values:
        raise ActionError(f"unknown channel {channel[:50]!r}", field="channel")
    target = (target or "").strip()
    if not target:
        raise ActionError("give where to send the alerts", field="target")
    target = _addresses(target) if channel == AlertChannel.EMAIL else _url(target)
    secret = ""
    key_id, box = "", b""
    if channel == AlertChannel.WEBHOOK:
        secret = "whsec_" + secrets.token_urlsafe(32)
        key_id, box = encrypt_bytes(secret.encode())
    ordered = [r for r in AlertReason.values if r in reasons]
    with transaction.atomic():
        rule = AlertRule.objects.create(
            name=name,
            agent=agent,
            reasons=AlertRule.reasons_field(ordered),
            channel=channel,
            target=target,
            secret_key_id=key_id,
            secret_box=box,
            send_resolved=send_resolved,
            created_by=_actor(actor).user,
        )
        audit(
            actor=_actor(actor),
            action=AuditAction.ALERT_RULE_CREATE,
            session=None,
            after=_rule_summary(rule),
            request_meta=request_meta,
        )
    forget_rules()
    return rule, secret


def _rule_summary(rule: AlertRule) -> dict[str, Any]:
    return {
        "rule": rule.id,
        "name": rule.name,
        "agent": rule.agent or "(every agent)",
        "reasons": rule.reason_list,
        "channel": rule.channel,
        "target": rule.shown_target,
        "enabled": rule.enabled,
    }


def alert_rule_set_enabled(
    *, rule: AlertRule, enabled: bool, actor: Actor = None, request_meta: dict | None = None
) -> AlertRule:
    _check_manage(actor, rule.agent)
    with transaction.atomic():
        before = _rule_summary(rule)
        AlertRule.objects.filter(id=rule.id).update(enabled=enabled)
        rule.enabled = enabled
        audit(
            actor=_actor(actor),
            action=AuditAction.ALERT_RULE_ENABLE if enabled else AuditAction.ALERT_RULE_DISABLE,
            session=None,
            before=before,
            after=_rule_summary(rule),
            request_meta=request_meta,
        )
    forget_rules()
    return rule


def alert_rule_delete(
    *, rule: AlertRule, actor: Actor = None, request_meta: dict | None = None
) -> None:
    """Delete the rule and its delivery log (undelivered messages are dropped with it)."""
    _check_manage(actor, rule.agent)
    with transaction.atomic():
        before = _rule_summary(rule)
        AlertRule.objects.filter(id=rule.id).delete()
        audit(
            actor=_actor(actor),
            action=AuditAction.ALERT_RULE_DELETE,
            session=None,
            before=before,
            request_meta=request_meta,
        )
    forget_rules()


def alert_rule_send_test(
    *, rule: AlertRule, actor: Actor = None, request_meta: dict | None = None
) -> AlertDelivery:
    """Queue a test message to the rule's channel; the workers send it like any other,
    and it shows in the rule's delivery log."""
    _check_manage(actor, rule.agent)
    with transaction.atomic():
        delivery = AlertDelivery.objects.create(
            rule=rule, kind=DeliveryKind.TEST, next_attempt_at=Now()
        )
        delivery.refresh_from_db(fields=["next_attempt_at"])
        audit(
            actor=_actor(actor),
            action=AuditAction.ALERT_RULE_TEST,
            session=None,
            after={**_rule_summary(rule), "delivery": str(delivery.uid)},
            request_meta=request_meta,
        )
    return delivery
