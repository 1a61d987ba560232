"""Numbers, durations and times as a person reads them, and query strings for links."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django import template
from django.utils import timezone
from django.utils.html import format_html

from ..dashboard.presenters import (
    STATUS_TEXT,
    format_ago,
    format_cost,
    format_count,
    format_duration,
    format_ms,
    pretty,
)
from ..models import Status
from ..permissions import (
    can_manage_teams,
    can_operate,
    can_operate_agent,
    can_operate_session,
    can_view_session,
)
from ..selectors import core as selectors

register = template.Library()


@register.filter
def may_operate(user: Any) -> bool:
    """Whether the user may change sessions (the operator role): what to offer them."""
    return can_operate(user)


@register.filter
def may_operate_session(user: Any, session: Any) -> bool:
    """Whether the user may change this session (a row's buttons): someone who acts on one
    team's sessions and reads another's is offered no button the action would refuse."""
    return can_operate_session(user, session)


@register.filter
def may_start(user: Any, agent: str) -> bool:
    """Whether the user may start a session of `agent` (the new-session form offers it)."""
    return can_operate_agent(user, agent)


@register.filter
def may_read_session(user: Any, session: Any) -> bool:
    """Whether the user may read `session` (a fork's parent, say): what the session's own
    page asks, so a link never shows what that page would answer with a 404."""
    return session is not None and can_view_session(user, session)


# The menu shows a link only to those its page admits: each filter below is the very
# function that page's guard asks, so the two cannot drift apart.


@register.filter
def may_manage_teams(user: Any) -> bool:
    """Opens the team page (an admin, or the team admin of some team)."""
    return can_manage_teams(user)


@register.filter
def may_use_admin(request: Any) -> bool:
    """Opens the Django admin: what the admin site itself asks of a request (an active staff
    account with a global role; team-only staff are sent to its log-in)."""
    from django.contrib import admin

    return getattr(request, "user", None) is not None and admin.site.has_permission(request)


@register.filter
def at(mapping: dict[Any, Any] | None, key: Any) -> Any:
    """mapping[key], or [] when it has none (a step without notes in the margin)."""
    return (mapping or {}).get(key, [])


@register.filter(name="json")
def as_json(value: Any) -> str:
    """A JSON value as JSON (what a tool receives and an operator reads), indented; not
    Python's repr (single quotes, True, None)."""
    return pretty(value)


@register.filter
def ms(value: Any) -> str:
    """Milliseconds: "223 ms", "1.4 s", "1 m 12 s"."""
    return format_ms(value) if value is not None else ""


@register.filter
def dur(value: Any) -> str:
    """A timedelta or seconds: "1 m 12 s"."""
    return format_duration(value)


@register.filter
def num(value: Any) -> str:
    """20000 -> "20,000"."""
    return format_count(value)


@register.filter
def cost(value: Any) -> str:
    return format_cost(value)


@register.filter
def budget_amount(value: Any, name: str) -> str:
    """A budget's limit or use in its own unit: steps and tokens counted, cost in
    dollars, time as a duration; "no limit" for None."""
    if value is None:
        return "no limit"
    if name == "cost":
        return "$" + (format_cost(value) or "0")
    if name == "time":
        return format_duration(float(value))
    return format_count(value)


def _status_text(status: str) -> tuple[str, str] | None:
    """(label, hint) of a status as a template has it (the column's plain string)."""
    try:
        return STATUS_TEXT[Status(status)]
    except ValueError:
        return None


@register.filter
def status_label(status: str) -> str:
    """A status in plain language: "waiting_input" -> "Waiting for a person"."""
    text = _status_text(status)
    return text[0] if text else status


@register.filter
def status_hint(status: str) -> str:
    text = _status_text(status)
    return text[1] if text else ""


@register.simple_tag
def ago(when: datetime | None, now: datetime | None = None) -> str:
    """<time> saying "5 min ago", with the exact time on hover."""
    if when is None:
        return ""
    now = now or timezone.now()
    exact = timezone.localtime(when).strftime("%Y-%m-%d %H:%M:%S %Z")
    return format_html(
        '<time datetime="{}" title="{}">{}</time>', when.isoformat(), exact, format_ago(when, now)
    )


@register.simple_tag
def qs(params: dict[str, Any] | None = None, **override: Any) -> str:
    """A query string ("?a=1&b=2") from params with some keys replaced (None or "" drops)."""
    values = {**(params or {}), **override}
    values = {k: v for k, v in values.items() if not (v is None or v is False or v == "")}
    return "?" + urlencode(values) if values else "?"


@register.simple_tag
def session_model(session: Any, configured: str) -> str:
    """The model a session's header names, for every kind of agent (see the selector)."""
    return selectors.session_model(session, configured)
