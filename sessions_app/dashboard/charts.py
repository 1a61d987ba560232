"""The list's charts: sessions started, completed and failed over time, and step latency
percentiles. Drawn server-side as SVG (the CSP allows no script to draw them), from a few
GROUP BY queries cached for a minute: every open list asks."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.db import connection
from django.db.models import Aggregate, Count, DurationField, ExpressionWrapper, F, Max
from django.db.models.functions import TruncDay, TruncHour
from django.utils import timezone

from ..models import AgentSession, Status, Step
from ..permissions import EVERYTHING, Scope
from .presenters import format_count, format_ms, rounded

CACHE_SECONDS = 60
# Latency is read from the latest steps by id (the primary key), not by a time index: the
# step table takes every append, and a percentile needs no more than a large sample.
LATENCY_SAMPLE = 100_000


@dataclass(frozen=True)
class Span:
    label: str
    buckets: int
    step: timedelta
    trunc: Any
    tick_every: int
    tick_format: str


SPANS = {
    "24h": Span("last 24 hours", 24, timedelta(hours=1), TruncHour, 4, "%H:00"),
    "7d": Span("last 7 days", 7 * 24, timedelta(hours=1), TruncHour, 24, "%a %d"),
    "30d": Span("last 30 days", 30, timedelta(days=1), TruncDay, 5, "%b %d"),
}


def _buckets(span: Span, now: datetime) -> list[datetime]:
    if span.step >= timedelta(days=1):
        first = timezone.localtime(now).replace(hour=0, minute=0, second=0, microsecond=0)
    else:
        first = now.replace(minute=0, second=0, microsecond=0)
    first -= span.step * (span.buckets - 1)
    return [first + span.step * i for i in range(span.buckets)]


def _key(dt: datetime, span: Span) -> datetime:
    """A bucket's key: the aware datetime the database truncated to (aware datetimes of the
    same instant compare and hash equal in any time zone)."""
    return dt


WIDTH, HEIGHT, LEFT, TOP = 560, 150, 44, 14
PLOT_W, PLOT_H = WIDTH - LEFT - 8, HEIGHT - TOP - 26


def _cache_key(chart: str, span_name: str, scope: Scope) -> str:
    """One cached chart per span and per scope: a team's chart counts its sessions only."""
    agents = "*" if scope.agents is None else ",".join(sorted(scope.agents))
    digest = hashlib.sha256(agents.encode()).hexdigest()[:16]
    return f"respawn:chart:{chart}:{span_name}:{digest}"


def activity(span_name: str, scope: Scope = EVERYTHING) -> dict[str, Any]:
    """Sessions started, completed and failed per bucket over the span, of `scope`."""
    key = _cache_key("activity", span_name, scope)
    cached = cache.get(key)
    if cached is not None:
        return cached
    span = SPANS[span_name]
    now = timezone.now()
    buckets = _buckets(span, now)
    since = buckets[0]
    started = {
        _key(k, span): n
        for k, n in AgentSession.objects.filter(scope.q(), created_at__gte=since)
        .annotate(b=span.trunc("created_at"))
        .values("b")
        .annotate(n=Count("id"))
        .values_list("b", "n")
    }
    ended: dict[str, dict[datetime, int]] = {Status.COMPLETED: {}, Status.FAILED: {}}
    for status, k, n in (
        AgentSession.objects.filter(
            scope.q(), updated_at__gte=since, status__in=(Status.COMPLETED, Status.FAILED)
        )
        .annotate(b=span.trunc("updated_at"))
        .values("status", "b")
        .annotate(n=Count("id"))
        .values_list("status", "b", "n")
    ):
        ended[status][_key(k, span)] = n
    series = {
        "started": [started.get(_key(b, span), 0) for b in buckets],
        "completed": [ended[Status.COMPLETED].get(_key(b, span), 0) for b in buckets],
        "failed": [ended[Status.FAILED].get(_key(b, span), 0) for b in buckets],
    }
    peak = max([max(v) for v in series.values()] + [1])
    chart = _lines(buckets, series, peak, span, value=format_count)
    chart["totals"] = {k: format_count(sum(v)) for k, v in series.items()}
    chart["peak"] = format_count(peak)
    cache.set(key, chart, CACHE_SECONDS)
    return chart


class Percentile(Aggregate):
    """PostgreSQL's percentile_cont(p) WITHIN GROUP (ORDER BY expression)."""

    function = "percentile_cont"
    template = "%(function)s(%(p)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = DurationField()  # of an interval: an interval

    def __init__(self, expression: Any, p: float, **extra: Any) -> None:
        super().__init__(expression, p=float(p), **extra)


def latency(span_name: str, scope: Scope = EVERYTHING) -> dict[str, Any]:
    """p50 and p95 of model calls and tool runs per bucket, in milliseconds, of `scope`."""
    key = _cache_key("latency", span_name, scope)
    cached = cache.get(key)
    if cached is not None:
        return cached
    span = SPANS[span_name]
    buckets = _buckets(span, timezone.now())
    newest = Step.objects.aggregate(m=Max("id"))["m"] or 0
    steps = Step.objects.filter(
        scope.q("session__agent"),
        id__gt=newest - LATENCY_SAMPLE,
        kind__in=("model", "tool_result"),
        started_at__gte=buckets[0],
        finished_at__isnull=False,
    )
    series: dict[str, list[float | None]] = {
        "model p50": [None] * len(buckets),
        "model p95": [None] * len(buckets),
        "tool p50": [None] * len(buckets),
        "tool p95": [None] * len(buckets),
    }
    index = {_key(b, span): i for i, b in enumerate(buckets)}
    if connection.vendor == "postgresql":
        seconds = ExpressionWrapper(
            F("finished_at") - F("started_at"), output_field=DurationField()
        )
        rows = (
            steps.annotate(b=span.trunc("started_at"), d=seconds)
            .values("kind", "b")
            .annotate(p50=Percentile("d", 0.5), p95=Percentile("d", 0.95), n=Count("id"))
            .values_list("kind", "b", "p50", "p95")
        )
        values: Sequence[tuple[str, datetime, float | None, float | None]] = [
            (kind, b, _ms(p50), _ms(p95)) for kind, b, p50, p95 in rows
        ]
    else:
        values = _percentiles_in_python(steps, span)
    for kind, b, p50, p95 in values:
        i = index.get(_key(b, span))
        if i is None:
            continue
        name = "model" if kind == "model" else "tool"
        series[f"{name} p50"][i] = p50
        series[f"{name} p95"][i] = p95
    peak = max([v for s in series.values() for v in s if v is not None] + [1.0])
    chart = _lines(buckets, series, peak, span, value=format_ms)
    chart["peak"] = format_ms(peak)
    chart["empty"] = all(v is None for s in series.values() for v in s)
    cache.set(key, chart, CACHE_SECONDS)
    return chart


def _ms(value: Any) -> float | None:
    """percentile_cont over an interval gives an interval (a timedelta) back."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        return value.total_seconds() * 1000
    return float(value) / 1000  # microseconds, as some drivers return a bare number


def _percentiles_in_python(steps, span: Span) -> list[tuple[str, datetime, float, float]]:
    groups: dict[tuple[str, datetime], list[float]] = {}
    for kind, b, started, finished in steps.annotate(b=span.trunc("started_at")).values_list(
        "kind", "b", "started_at", "finished_at"
    ):
        groups.setdefault((kind, b), []).append((finished - started).total_seconds() * 1000)
    out = []
    for (kind, b), durations in groups.items():
        durations.sort()
        out.append((kind, b, _quantile(durations, 0.5), _quantile(durations, 0.95)))
    return out


def _quantile(values: list[float], p: float) -> float:
    """Linear interpolation between the closest ranks, as percentile_cont does."""
    if len(values) == 1:
        return values[0]
    position = p * (len(values) - 1)
    low = int(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


def _lines(
    buckets: list[datetime], series: dict[str, list[Any]], peak: float, span: Span, value
) -> dict[str, Any]:
    """Polylines of each series (a gap where a bucket has no value), ticks and hover points."""
    step_x = PLOT_W / max(len(buckets) - 1, 1)

    def y(v: float) -> float:
        return TOP + PLOT_H - PLOT_H * v / peak

    lines = []
    for name, values in series.items():
        runs: list[list[str]] = [[]]
        points = []
        for i, v in enumerate(values):
            if v is None:
                runs.append([])
                continue
            x = LEFT + i * step_x
            runs[-1].append(f"{x:.1f},{y(v):.1f}")
            points.append(
                {
                    "x": x,
                    "y": y(v),
                    "title": f"{timezone.localtime(buckets[i]).strftime('%a %d %H:%M')}: "
                    f"{name} {value(v)}",
                }
            )
        lines.append(
            {
                "name": name,
                "css": name.replace(" ", "-"),
                "paths": [" ".join(r) for r in runs if len(r) > 1],
                "dots": [p for i, p in enumerate(points)],
            }
        )
    ticks = [
        {"x": LEFT + i * step_x, "label": timezone.localtime(b).strftime(span.tick_format)}
        for i, b in enumerate(buckets)
        if i % span.tick_every == 0
    ]
    grid = [{"y": y(peak * f), "label": value(peak * f)} for f in (0, 0.5, 1)]
    return {
        "lines": rounded(lines, 1),
        "ticks": rounded(ticks, 1),
        "grid": rounded(grid, 1),
        "width": WIDTH,
        "height": HEIGHT,
        "left": LEFT,
        "right": LEFT + PLOT_W,
        "base": TOP + PLOT_H,
        "span": span.label,
    }


def activity_chart(activity: list[dict[str, Any]]) -> dict[str, Any]:
    """The attention page's bars: sessions started and finished per hour, last 24 hours."""
    peak = max([max(h["started"], h["finished"]) for h in activity] + [1])
    bar_w = 22
    return {
        "peak": peak,
        "bar_w": bar_w,
        "hours": [
            {
                "x": 30 + i * (bar_w + 6),
                "started_h": 100 * h["started"] / peak,
                "finished_h": 100 * h["finished"] / peak,
                "started_y": 110 - 100 * h["started"] / peak,
                "finished_y": 110 - 100 * h["finished"] / peak,
                **h,
            }
            for i, h in enumerate(activity)
        ],
    }
