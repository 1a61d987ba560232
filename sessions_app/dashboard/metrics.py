"""The web processes' /metrics: what the database and Redis say now, read at scrape time
(sessions, what needs attention, usage, search lag) beside the queues' (django-rq's
collector). A worker's own counters are sessions_app.telemetry's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db.models import Count, Sum
from django.utils import timezone
from django_rq.contrib.prometheus import RQCollector
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..models import AgentSession, ModelUsage
from ..selectors.core import ATTENTION_CAP, _attention_querysets
from ..upkeep.search import lag


class DeploymentCollector:
    """What the database and Redis say now, for the web processes' /metrics."""

    def collect(self) -> Iterator[Any]:
        sessions = GaugeMetricFamily(
            "respawn_sessions", "Sessions by status and agent", labels=["status", "agent"]
        )
        for row in AgentSession.objects.values("status", "agent").annotate(n=Count("id")):
            sessions.add_metric([row["status"], row["agent"]], row["n"])
        yield sessions

        attention = GaugeMetricFamily(
            "respawn_sessions_needing_attention",
            f"Sessions in each section of 'needs attention' (counted up to {ATTENTION_CAP})",
            labels=["section"],
        )
        for key, rows in _attention_querysets(timezone.now()).items():
            attention.add_metric([key], rows.values("id")[:ATTENTION_CAP].count())
        yield attention

        fields = ("calls", "tokens_in", "tokens_out", "cache_read_tokens", "cache_write_tokens")
        totals = ModelUsage.objects.values("agent", "model").annotate(
            cost=Sum("cost"), **{name: Sum(name) for name in fields}
        )
        calls = CounterMetricFamily(
            "respawn_usage_model_calls",
            "Model calls recorded, by agent and model",
            labels=["agent", "model"],
        )
        tokens = CounterMetricFamily(
            "respawn_usage_tokens",
            "Tokens recorded, by agent, model and type",
            labels=["agent", "model", "type"],
        )
        cost = CounterMetricFamily(
            "respawn_usage_cost_usd",
            "Cost recorded, by agent and model (US dollars)",
            labels=["agent", "model"],
        )
        for row in totals:
            labels = [row["agent"], row["model"]]
            calls.add_metric(labels, row["calls"] or 0)
            cost.add_metric(labels, float(row["cost"] or 0))
            for name, kind in (
                ("tokens_in", "input"),
                ("tokens_out", "output"),
                ("cache_read_tokens", "cache_read"),
                ("cache_write_tokens", "cache_write"),
            ):
                tokens.add_metric([*labels, kind], row[name] or 0)
        yield calls
        yield tokens
        yield cost

        search = GaugeMetricFamily(
            "respawn_search_lag_steps", "Steps written that search has not indexed yet"
        )
        search.add_metric([], lag())
        yield search


def deployment_metrics() -> bytes:
    """The deployment's metrics and its queues' (django-rq's collector: jobs by queue and
    status, workers), in Prometheus' text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DeploymentCollector())
    registry.register(RQCollector())
    return generate_latest(registry)
