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
from ..permissions import can_operate
from ..selectors import core as selectors

register = template.Library()


@register.filter
def may_operate(user: Any) -> bool:
    """Whether the user may change sessions (the operator role): what to offer them."""
    return can_operate(user)


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
