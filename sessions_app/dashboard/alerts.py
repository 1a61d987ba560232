"""The alerts pages: the rules (viewers read them; operators and admins create, switch,
delete and test them, each audited by the service) and each rule's delivery log. Plain
forms that work without JavaScript; the log redraws itself while messages are on their way.

Narrowed to teams like the sessions: a person reads the rules of the agents whose sessions
they read, and manages those of the agents whose sessions they may act on. A rule for every
agent is for global roles; another team's rule is a 404, as its sessions are."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from ..models import AlertChannel, AlertReason, DeliveryStatus
from ..permissions import can_manage_alert_rule, can_operate, can_view, operate_scope, session_scope
from ..selectors import alerts as selectors
from ..selectors.core import agent_names
from ..services import alerts as services
from ..services.core import ActionError
from ..validation import InvalidInput, parse_int
from ..web.http import DASHBOARD, HtmxRequest, request_meta

MANAGE_REFUSAL = "only operators and admins can manage alert rules"


def _require_view(request: HtmxRequest) -> None:
    if not can_view(request.user):
        raise PermissionDenied("your account has no role here (viewer or operator)")


def _require_manage(request: HtmxRequest, rule: Any = None) -> None:
    """Viewers are refused; so is an operator who may not manage `rule` (one for every
    agent, or for an agent whose sessions they only read). The services check it again."""
    _require_view(request)
    if not can_operate(request.user):
        raise PermissionDenied(MANAGE_REFUSAL)
    if rule is not None and not can_manage_alert_rule(request.user, rule.agent):
        raise PermissionDenied(
            "a rule is managed by those who may act on its agent's sessions (a rule for "
            "every agent: global operators and admins)"
        )


def _rule(request: HtmxRequest, rule_id: int):
    _require_view(request)
    rule = selectors.alert_rule(rule_id, session_scope(request.user))
    if rule is None:
        raise Http404("no such alert rule")
    return rule


def _rules_context(request: HtmxRequest, form: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "rules": selectors.alert_rules(session_scope(request.user)),
        "reasons": AlertReason.choices,
        "channels": AlertChannel.choices,
        "agents": agent_names(operate_scope(request.user)),
        "can_manage": can_operate(request.user),
        # May leave the agent empty (a rule for every agent): global operators and admins.
        "every_agent": can_manage_alert_rule(request.user, ""),
        "form": form or {"reasons": [AlertReason.APPROVAL.value], "send_resolved": True},
    }


@login_required
@require_http_methods(["GET", "POST"])
def alert_rules(request: HtmxRequest) -> HttpResponse:
    """The rules, and the form that creates one. A created webhook rule's page shows its
    secret this once."""
    _require_view(request)
    if request.method == "GET":
        return render(request, "sessions/alerts.html", _rules_context(request))
    _require_manage(request)
    form: dict[str, Any] = {
        "name": request.POST.get("name", ""),
        "agent": request.POST.get("agent", ""),
        "reasons": request.POST.getlist("reasons"),
        "channel": request.POST.get("channel", ""),
        "target": request.POST.get("target", ""),
        "send_resolved": bool(request.POST.get("send_resolved")),
    }
    try:
        rule, secret = services.alert_rule_create(
            **form, actor=request.user, request_meta=request_meta(request, DASHBOARD)
        )
    except ActionError as exc:
        context = {**_rules_context(request, form), "error": str(exc), "error_field": exc.field}
        return render(request, "sessions/alerts.html", context, status=exc.status)
    return _rule_page(request, rule, secret=secret, status=201)


def _rule_page(request: HtmxRequest, rule, *, secret: str = "", status: int = 200) -> HttpResponse:
    before = None
    error = None
    if request.GET.get("before"):
        try:
            before = parse_int(request.GET["before"], "before", maximum=2**63 - 1)
        except InvalidInput as exc:
            error = str(exc)
    page, more = selectors.delivery_log(rule, before=before)
    unsettled = any(
        d.status not in (DeliveryStatus.DELIVERED, DeliveryStatus.GAVE_UP) for d in page
    )
    context = {
        "rule": rule,
        "secret": secret,
        "deliveries": page,
        "next_before": page[-1].id if more and page else None,
        "can_manage": can_manage_alert_rule(request.user, rule.agent),
        "error": error,
        "poll": unsettled and before is None,
    }
    if request.htmx and request.GET.get("fragment") == "log":
        return render(request, "sessions/alert_rule.html#log", context)
    return render(request, "sessions/alert_rule.html", context, status=400 if error else status)


@login_required
@require_GET
def alert_rule(request: HtmxRequest, rule_id: int) -> HttpResponse:
    return _rule_page(request, _rule(request, rule_id))


@login_required
@require_POST
def alert_rule_test(request: HtmxRequest, rule_id: int) -> HttpResponse:
    rule = _rule(request, rule_id)
    _require_manage(request, rule)
    services.alert_rule_send_test(
        rule=rule, actor=request.user, request_meta=request_meta(request, DASHBOARD)
    )
    messages.success(request, "A test message is queued: the log below shows its delivery.")
    return redirect("sessions:alert_rule", rule_id=rule.id)


@login_required
@require_POST
def alert_rule_switch(request: HtmxRequest, rule_id: int) -> HttpResponse:
    rule = _rule(request, rule_id)
    _require_manage(request, rule)
    enabled = request.POST.get("enabled") == "1"
    services.alert_rule_set_enabled(
        rule=rule,
        enabled=enabled,
        actor=request.user,
        request_meta=request_meta(request, DASHBOARD),
    )
    messages.success(request, f"Rule {rule.name!r} is {'on' if enabled else 'off'}.")
    return redirect("sessions:alert_rule", rule_id=rule.id)


@login_required
@require_POST
def alert_rule_delete(request: HtmxRequest, rule_id: int) -> HttpResponse:
    rule = _rule(request, rule_id)
    _require_manage(request, rule)
    services.alert_rule_delete(
        rule=rule, actor=request.user, request_meta=request_meta(request, DASHBOARD)
    )
    messages.success(request, f"Rule {rule.name!r} is deleted, with its delivery log.")
    return redirect("sessions:alerts")
