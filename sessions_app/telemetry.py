"""Respawn in a deployment's monitoring: Prometheus metrics and OpenTelemetry traces.

Two sources of metrics, because they live in different processes:
- each worker process counts what it does (runs, steps written, model and tool calls with
  their latencies, recoveries, fenced writes, budget pauses, reconciler dispatches) in
  WORKER_METRICS, served on RESPAWN_WORKER_METRICS_PORT (Prometheus adds the workers up);
- the web processes' `/metrics` reads the state of the whole deployment from the database
  and Redis at scrape time (sessions by status, stuck, waiting for a person, queue depth,
  tokens and cost by agent and model).

Traces follow OpenTelemetry's GenAI semantic conventions: an `invoke_agent` span per run, a
`chat` span per model call and an `execute_tool` span per tool call, with
`gen_ai.conversation.id` the session id. Every run of a session belongs to one trace, whose
id is the session id: a run resumed after a crash, on another worker, continues it. Off
unless the standard OTEL_* variables ask for an exporter (OTEL_TRACES_EXPORTER, or an
OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT); the SDK is the optional extra `respawn[otel]`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from agent_runtime.telemetry import (
    ModelCallRecord,
    RunRecord,
    Telemetry,
    ToolCallRecord,
)

log = logging.getLogger("respawn.telemetry")

# --- Prometheus: one worker process ------------------------------------------------------

WORKER_METRICS = CollectorRegistry(auto_describe=True)
_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_RECOVERY = (0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)

RUNS = Counter(
    "respawn_runs", "Runs of sessions by outcome", ["agent", "outcome"], registry=WORKER_METRICS
)
STEPS = Counter("respawn_steps", "Steps written, by kind", ["kind"], registry=WORKER_METRICS)
CHECKPOINTS = Counter("respawn_checkpoints", "Checkpoints written", registry=WORKER_METRICS)
APPEND_SECONDS = Histogram(
    "respawn_append_seconds",
    "Time to write one append (its steps, and the checkpoint with them)",
    buckets=_LATENCY,
    registry=WORKER_METRICS,
)
MODEL_CALLS = Counter(
    "respawn_model_calls",
    "Model calls by provider, model and outcome",
    ["provider", "model", "outcome"],
    registry=WORKER_METRICS,
)
MODEL_SECONDS = Histogram(
    "respawn_model_call_seconds",
    "Model call latency, retries included",
    ["provider", "model"],
    buckets=_LATENCY,
    registry=WORKER_METRICS,
)
MODEL_TOKENS = Counter(
    "respawn_model_tokens",
    "Tokens of model calls (input counts cache reads and writes as well)",
    ["agent", "model", "type"],
    registry=WORKER_METRICS,
)
MODEL_COST = Counter(
    "respawn_model_cost_usd",
    "What model calls cost, in US dollars",
    ["agent", "model"],
    registry=WORKER_METRICS,
)
TOOL_CALLS = Counter(
    "respawn_tool_calls",
    "Tool calls by tool and outcome",
    ["tool", "outcome"],
    registry=WORKER_METRICS,
)
TOOL_SECONDS = Histogram(
    "respawn_tool_call_seconds",
    "Tool call latency, retries included",
    ["tool"],
    buckets=_LATENCY,
    registry=WORKER_METRICS,
)
RECOVERIES = Counter(
    "respawn_recoveries",
    "Runs that took over the expired lease of a worker that died or froze",
    ["agent"],
    registry=WORKER_METRICS,
)
RECOVERY_SECONDS = Histogram(
    "respawn_recovery_seconds",
    "From the last durable step before a crash to the recovering run's start",
    buckets=_RECOVERY,
    registry=WORKER_METRICS,
)
FENCED = Counter(
    "respawn_fenced",
    "Writes refused because the lease was lost (fenced off)",
    ["where"],
    registry=WORKER_METRICS,
)
BUDGET_PAUSES = Counter(
    "respawn_budget_pauses",
    "Sessions paused by a budget",
    ["budget"],
    registry=WORKER_METRICS,
)
DISPATCHES = Counter(
    "respawn_reconciler_dispatches",
    "Sessions the reconciler dispatched again (stuck, lost job, expired lease)",
    registry=WORKER_METRICS,
)


class PrometheusTelemetry(Telemetry):
    """Counts into WORKER_METRICS."""

    @contextlib.contextmanager
    def run(self, record: RunRecord) -> Iterator[RunRecord]:
        if record.recovering:
            RECOVERIES.labels(record.agent).inc()
            if record.recovery_seconds is not None:
                RECOVERY_SECONDS.observe(record.recovery_seconds)
        try:
            yield record
        finally:
            RUNS.labels(record.agent, record.outcome or "error").inc()

    @contextlib.contextmanager
    def model_call(self, record: ModelCallRecord) -> Iterator[ModelCallRecord]:
        began = time.perf_counter()
        ok = False
        try:
            yield record
            ok = True
        finally:
            MODEL_SECONDS.labels(record.provider, record.model).observe(time.perf_counter() - began)
            MODEL_CALLS.labels(record.provider, record.model, "ok" if ok else "error").inc()
            if ok:
                spec = f"{record.provider}:{record.model}"
                agent = record.run.agent
                for kind, n in (
                    ("input", record.input_tokens),
                    ("output", record.output_tokens),
                    ("cache_read", record.cache_read_tokens),
                    ("cache_write", record.cache_write_tokens),
                ):
                    if n:
                        MODEL_TOKENS.labels(agent, spec, kind).inc(n)
                if record.cost:
                    MODEL_COST.labels(agent, spec).inc(record.cost)

    @contextlib.contextmanager
    def tool_call(self, record: ToolCallRecord) -> Iterator[ToolCallRecord]:
        began = time.perf_counter()
        try:
            yield record
        finally:
            TOOL_SECONDS.labels(record.tool).observe(time.perf_counter() - began)
            TOOL_CALLS.labels(record.tool, "ok" if record.ok else "error").inc()

    def steps_written(self, run, kinds, seconds, checkpoint_seq) -> None:
        APPEND_SECONDS.observe(seconds)
        for kind in kinds:
            STEPS.labels(str(kind)).inc()
        if checkpoint_seq is not None:
            CHECKPOINTS.inc()

    def fenced(self, run, where) -> None:
        FENCED.labels(where).inc()

    def budget_reached(self, run, budget) -> None:
        BUDGET_PAUSES.labels(budget).inc()


def serve_worker_metrics(port: int, tries: int = 16) -> int | None:
    """Serve WORKER_METRICS on `port`, or the next free one of `tries` (several workers on
    one host); the port taken, or None when none was free."""
    from prometheus_client import start_http_server

    for candidate in range(port, port + tries):
        try:
            start_http_server(candidate, registry=WORKER_METRICS)
        except OSError:
            continue
        log.info("worker metrics on port %d", candidate)
        return candidate
    log.warning("worker metrics not served: ports %d-%d are taken", port, port + tries - 1)
    return None


# --- OpenTelemetry --------------------------------------------------------------------------

OTEL_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def otel_requested(environ: dict[str, str] | None = None) -> bool:
    """Do the standard variables ask for traces? (OTEL_SDK_DISABLED=true says no.)"""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return any(env.get(name, "").strip() for name in OTEL_ENDPOINTS)


def tracer_from_environment() -> Any:
    """A tracer exporting as OTEL_* say (otlp over HTTP, or console), or None when traces
    are off. ImportError when they are asked for without the SDK installed."""
    if not otel_requested():
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SpanExporter,
    )

    names = [
        n.strip()
        for n in (os.environ.get("OTEL_TRACES_EXPORTER") or "otlp").split(",")
        if n.strip()
    ]
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or "respawn"})
    provider = TracerProvider(resource=resource)
    for name in names:
        exporter: SpanExporter
        if name == "console":
            exporter = ConsoleSpanExporter()
        elif name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        else:
            raise ValueError(f"OTEL_TRACES_EXPORTER: {name!r} is not supported (otlp, console)")
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider.get_tracer("respawn")


def session_trace_parent(session_id: str) -> Any:
    """The context every run of a session starts its span in: a remote parent whose trace
    id is the session id, so all of a session's runs (a crash, a resume on another worker,
    an operator's resume days later) are one trace."""
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    number = uuid.UUID(str(session_id)).int
    span_id = (number & 0xFFFF_FFFF_FFFF_FFFF) or 1
    parent = SpanContext(
        trace_id=number or 1,
        span_id=span_id,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(NonRecordingSpan(parent))


class OpenTelemetryTelemetry(Telemetry):
    """Spans per the GenAI semantic conventions, through `tracer`."""

    def __init__(self, tracer: Any) -> None:
        self.tracer = tracer

    def _child_context(self, run: RunRecord) -> Any:
        """Under the run's span; a fan-out branch (a job of its own, no run span) directly
        in the session's trace."""
        from opentelemetry import trace

        span = run.extra.get("otel_span")
        if span is None:
            return session_trace_parent(run.session_id)
        return trace.set_span_in_context(span)

    @contextlib.contextmanager
    def _span(self, name: str, parent: Any, kind: Any, attributes: dict[str, Any]) -> Iterator[Any]:
        """A span that records the exception that ends it (error.type and status)."""
        from opentelemetry.trace import Status, StatusCode

        span = self.tracer.start_span(name, context=parent, kind=kind, attributes=attributes)
        try:
            yield span
        except BaseException as exc:
            span.set_attribute("error.type", type(exc).__name__)
            span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
            raise
        finally:
            span.end()

    @staticmethod
    def _failed(span: Any, reason: str, message: str | None) -> None:
        from opentelemetry.trace import Status, StatusCode

        span.set_attribute("error.type", reason)
        span.set_status(Status(StatusCode.ERROR, (message or "")[:200]))

    @contextlib.contextmanager
    def run(self, record: RunRecord) -> Iterator[RunRecord]:
        from opentelemetry.trace import SpanKind

        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": record.agent,
            "gen_ai.conversation.id": record.session_id,
            "respawn.agent.version": record.agent_version,
            "respawn.worker": record.worker,
            "respawn.recovering": record.recovering,
        }
        parent = session_trace_parent(record.session_id)
        name = f"invoke_agent {record.agent}"
        with self._span(name, parent, SpanKind.INTERNAL, attributes) as span:
            if record.recovering:
                span.add_event(
                    "recovery", {"respawn.recovery.seconds": record.recovery_seconds or 0.0}
                )
            record.extra["otel_span"] = span
            try:
                yield record
            finally:
                span.set_attribute("respawn.outcome", record.outcome or "error")
                if record.outcome == "failed":
                    self._failed(span, "session_failed", record.error)

    @contextlib.contextmanager
    def model_call(self, record: ModelCallRecord) -> Iterator[ModelCallRecord]:
        from opentelemetry.trace import SpanKind

        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": record.provider,
            "gen_ai.request.model": record.model,
            "gen_ai.conversation.id": record.run.session_id,
            "gen_ai.agent.name": record.run.agent,
        }
        parent = self._child_context(record.run)
        with self._span(f"chat {record.model}", parent, SpanKind.CLIENT, attributes) as span:
            yield record
            span.set_attribute("gen_ai.response.model", record.model)
            span.set_attribute("gen_ai.usage.input_tokens", record.input_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", record.output_tokens)
            span.set_attribute("gen_ai.usage.cache_read.input_tokens", record.cache_read_tokens)
            span.set_attribute(
                "gen_ai.usage.cache_creation.input_tokens", record.cache_write_tokens
            )
            if record.finish:
                span.set_attribute("gen_ai.response.finish_reasons", [record.finish])
            if record.cost is not None:
                span.set_attribute("respawn.cost_usd", record.cost)

    @contextlib.contextmanager
    def tool_call(self, record: ToolCallRecord) -> Iterator[ToolCallRecord]:
        from opentelemetry.trace import SpanKind

        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": record.tool,
            "gen_ai.tool.call.id": record.call_id,
            "gen_ai.tool.type": "function",
            "gen_ai.conversation.id": record.run.session_id,
        }
        parent = self._child_context(record.run)
        name = f"execute_tool {record.tool}"
        with self._span(name, parent, SpanKind.INTERNAL, attributes) as span:
            yield record
            span.set_attribute("respawn.tool.attempts", record.attempts)
            if record.ok is False:
                self._failed(span, "tool_error", record.error)

    def _event(self, run: RunRecord, name: str, attributes: dict[str, Any]) -> None:
        span = run.extra.get("otel_span")
        if span is not None:
            span.add_event(name, attributes)

    def steps_written(self, run, kinds, seconds, checkpoint_seq) -> None:
        if checkpoint_seq is not None:
            self._event(run, "checkpoint", {"respawn.checkpoint.seq": checkpoint_seq})

    def fenced(self, run, where) -> None:
        self._event(run, "fenced", {"respawn.fenced.where": where})

    def budget_reached(self, run, budget) -> None:
        self._event(run, "budget_reached", {"respawn.budget": budget})
