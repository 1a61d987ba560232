"""Observability: OpenTelemetry spans per the GenAI semantic conventions (checked with the
SDK's in-memory exporter), the worker's Prometheus metrics, and the deployment's /metrics
scraped and parsed as Prometheus parses it, its values checked against the database."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace

import pytest
from django.db.models import Count, Sum
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client.parser import text_string_to_metric_families

from agent_runtime.loop import run_session
from agent_runtime.telemetry import combine
from sessions_app import telemetry
from sessions_app.models import AgentSession, ApiToken, ModelUsage, Step
from sessions_app.runtime import run_config
from sessions_app.services.core import session_approve, session_start
from sessions_app.store import DjangoEffects, session_store

from ..conftest import run_session_inline

# Committed, as a worker's writes are: a run's heartbeat reads on its own connection.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter, telemetry.OpenTelemetryTelemetry(provider.get_tracer("test"))
    provider.shutdown()


def run(session, observer, worker="w-test"):
    config = replace(
        run_config(),
        worker_id=worker,
        telemetry=combine([telemetry.PrometheusTelemetry(), observer]),
    )
    result = run_session_inline(session, config=config)
    session.refresh_from_db()
    return result


def by_operation(finished):
    out: dict[str, list] = {}
    for span in finished:
        out.setdefault(span.attributes["gen_ai.operation.name"], []).append(span)
    return out


# --- Traces -----------------------------------------------------------------------------------


def test_a_run_is_an_invoke_agent_span_with_chat_and_execute_tool_children(spans):
    exporter, observer = spans
    session = session_start(agent="demo", input="what is (12*7)+3, then save it as a note")
    run(session, observer)
    assert session.status == "completed"

    ops = by_operation(exporter.get_finished_spans())
    (agent_span,) = ops["invoke_agent"]
    assert agent_span.name == "invoke_agent demo"
    assert agent_span.kind == SpanKind.INTERNAL
    assert agent_span.attributes["gen_ai.agent.name"] == "demo"
    assert agent_span.attributes["gen_ai.conversation.id"] == str(session.id)
    assert agent_span.attributes["respawn.outcome"] == "completed"
    # The trace is the session: its id is the session id.
    assert agent_span.context.trace_id == uuid.UUID(str(session.id)).int
    checkpoints = [e for e in agent_span.events if e.name == "checkpoint"]
    assert checkpoints and checkpoints[-1].attributes["respawn.checkpoint.seq"] == session.head

    model_steps = list(Step.objects.filter(session=session, kind="model").order_by("seq"))
    chats = sorted(ops["chat"], key=lambda s: s.start_time)
    assert len(chats) == len(model_steps)
    for chat, step in zip(chats, model_steps, strict=True):
        assert chat.name == "chat demo" and chat.kind == SpanKind.CLIENT
        assert chat.parent.span_id == agent_span.context.span_id
        assert chat.context.trace_id == agent_span.context.trace_id
        assert chat.attributes["gen_ai.provider.name"] == "scripted"
        assert chat.attributes["gen_ai.request.model"] == "demo"
        assert chat.attributes["gen_ai.usage.input_tokens"] == step.tokens_in
        assert chat.attributes["gen_ai.usage.output_tokens"] == step.tokens_out
        assert chat.attributes["gen_ai.usage.cache_read.input_tokens"] == 0
        finish = "tool_calls" if step.payload["tool_calls"] else "stop"
        assert chat.attributes["gen_ai.response.finish_reasons"] == (finish,)

    tool_steps = Step.objects.filter(session=session, kind="tool_call").order_by("seq")
    tools = sorted(ops["execute_tool"], key=lambda s: s.start_time)
    assert [t.attributes["gen_ai.tool.name"] for t in tools] == [
        s.payload["name"] for s in tool_steps
    ]
    for span, step in zip(tools, tool_steps, strict=True):
        assert span.name == f"execute_tool {step.payload['name']}"
        assert span.attributes["gen_ai.tool.call.id"] == step.payload["call_id"]
        assert span.attributes["gen_ai.tool.type"] == "function"
        assert span.parent.span_id == agent_span.context.span_id
        assert span.status.status_code != StatusCode.ERROR


def test_a_crash_and_a_resume_continue_the_same_trace(spans):
    exporter, observer = spans
    session = session_start(agent="approval", input="pay invoice 9")
    run(session, observer, worker="first")
    assert session.status == "waiting_input"
    session_approve(session_id=session.id, reason="ok")

    # A worker takes the session and dies before writing a step: its lease expires.
    store = session_store()
    assert store.claim(str(session.id), "dead-worker", 0.05) is not None
    time.sleep(0.2)
    run(session, observer, worker="second")
    assert session.status == "completed"

    runs = sorted(
        by_operation(exporter.get_finished_spans())["invoke_agent"], key=lambda s: s.start_time
    )
    assert [r.attributes["respawn.worker"] for r in runs] == ["first", "second"]
    assert {r.context.trace_id for r in runs} == {uuid.UUID(str(session.id)).int}
    assert runs[0].attributes["respawn.outcome"] == "waiting_input"
    assert runs[0].attributes["respawn.recovering"] is False
    assert runs[1].attributes["respawn.recovering"] is True
    (recovery,) = [e for e in runs[1].events if e.name == "recovery"]
    assert recovery.attributes["respawn.recovery.seconds"] >= 0.1
    # Every span of both runs is in the one trace.
    assert {s.context.trace_id for s in exporter.get_finished_spans()} == {
        uuid.UUID(str(session.id)).int
    }


def test_a_failing_tool_call_is_an_error_span(spans, settings):
    exporter, observer = spans
    session = session_start(agent="demo", input="what is 1/0")
    run(session, observer)
    tools = by_operation(exporter.get_finished_spans())["execute_tool"]
    failed = [s for s in tools if s.status.status_code == StatusCode.ERROR]
    results = Step.objects.filter(session=session, kind="tool_result", payload__status="error")
    assert len(failed) == results.count() >= 1
    assert all(s.attributes["error.type"] == "tool_error" for s in failed)


def test_traces_are_off_unless_the_otel_variables_ask_for_them():
    assert not telemetry.otel_requested({})
    assert not telemetry.otel_requested({"OTEL_TRACES_EXPORTER": "none"})
    assert telemetry.otel_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert telemetry.otel_requested({"OTEL_TRACES_EXPORTER": "console"})
    assert not telemetry.otel_requested(
        {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}
    )


def test_an_unknown_exporter_is_refused_by_the_system_check(monkeypatch):
    from sessions_app.checks import check_tracing

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    (error,) = check_tracing()
    assert error.id == "respawn.E031" and "'zipkin' is not supported" in error.msg


# --- Metrics ----------------------------------------------------------------------------------


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(parsed, name, **labels):
    return parsed.get((name, tuple(sorted(labels.items()))), 0.0)


def test_the_worker_counts_steps_model_and_tool_calls(spans):
    _, observer = spans
    registry = telemetry.WORKER_METRICS

    def now(name, **labels):
        return registry.get_sample_value(name, labels) or 0.0

    before = {
        "model": now("respawn_steps_total", kind="model"),
        "tool": now("respawn_steps_total", kind="tool_result"),
        "calls": now("respawn_model_calls_total", provider="scripted", model="demo", outcome="ok"),
        "calc": now("respawn_tool_calls_total", tool="calculator", outcome="ok"),
        "runs": now("respawn_runs_total", agent="demo", outcome="completed"),
        "append": now("respawn_append_seconds_count"),
    }
    session = session_start(agent="demo", input="what is (12*7)+3, then save it as a note")
    run(session, observer)
    model_steps = Step.objects.filter(session=session, kind="model").count()
    results = Step.objects.filter(session=session, kind="tool_result").count()
    assert now("respawn_steps_total", kind="model") - before["model"] == model_steps
    assert now("respawn_steps_total", kind="tool_result") - before["tool"] == results
    calls = now("respawn_model_calls_total", provider="scripted", model="demo", outcome="ok")
    assert calls - before["calls"] == model_steps
    assert now("respawn_tool_calls_total", tool="calculator", outcome="ok") - before["calc"] == 1
    assert now("respawn_runs_total", agent="demo", outcome="completed") - before["runs"] == 1
    assert now("respawn_append_seconds_count") - before["append"] >= 1


def test_the_metrics_endpoint_answers_what_the_database_says(client, users, settings, spans):
    settings.RESPAWN_METRICS_TOKEN = "scrape-secret-123"
    settings.RESPAWN_PRICES = '{"scripted:*": {"input": 5, "output": 10}}'
    from sessions_app.runtime import price_table

    price_table.cache_clear()
    _, observer = spans
    try:
        for text in ("what is 2+2", "what is 3+3"):
            run(session_start(agent="demo", input=text), observer)
    finally:
        price_table.cache_clear()
    session_start(agent="slow", input="count to 3")  # queued, never run

    anonymous = client.get("/metrics")
    assert anonymous.status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-secret-123")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    parsed = samples(response.content.decode())

    for row in AgentSession.objects.values("status", "agent").annotate(n=Count("id")):
        assert (
            value(parsed, "respawn_sessions", status=row["status"], agent=row["agent"]) == row["n"]
        )
    for row in ModelUsage.objects.values("agent", "model").annotate(
        cost=Sum("cost"), calls=Sum("calls"), tokens_in=Sum("tokens_in")
    ):
        labels = {"agent": row["agent"], "model": row["model"]}
        assert value(parsed, "respawn_usage_cost_usd_total", **labels) == pytest.approx(
            float(row["cost"])
        )
        assert value(parsed, "respawn_usage_model_calls_total", **labels) == row["calls"]
        assert (
            value(parsed, "respawn_usage_tokens_total", type="input", **labels) == row["tokens_in"]
        )
    assert value(parsed, "respawn_usage_cost_usd_total", agent="demo", model="scripted:demo") > 0
    assert ("respawn_sessions_needing_attention", (("section", "budget"),)) in parsed
    # The queues, from django-rq's collector.
    assert any(name == "rq_jobs" for name, _ in parsed)

    # An API token of a viewer scrapes too; a logged-in viewer reads it in a browser.
    _, raw = ApiToken.issue(users["viewer"])
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 200
    _, outsider = ApiToken.issue(users["outsider"])
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {outsider}").status_code == 401
    client.force_login(users["viewer"])
    assert client.get("/metrics").status_code == 200


def test_fan_out_branches_report_their_tool_calls_in_the_sessions_trace(spans):
    from agent_runtime.loop import Outcome, run_branch
    from demo_agents import demo_agents

    exporter, observer = spans
    agents = demo_agents(research_delay=0.01, research_parallel=4)
    config = replace(run_config(), telemetry=combine([observer]))
    session = session_start(agent="research", input="research checkpoints in 4 sources")
    store = session_store()
    fanned = run_session(
        str(session.id), store=store, agents=agents, effects=DjangoEffects(), config=config
    )
    assert fanned.outcome == Outcome.FANNED_OUT and len(fanned.branches) == 4
    for seq in fanned.branches:
        run_branch(
            str(session.id), seq, store=store, agents=agents, effects=DjangoEffects(), config=config
        )

    tools = by_operation(exporter.get_finished_spans())["execute_tool"]
    calls = Step.objects.filter(session=session, kind="tool_call", seq__in=fanned.branches)
    assert sorted(s.attributes["gen_ai.tool.call.id"] for s in tools) == sorted(
        c.payload["call_id"] for c in calls
    )
    # Jobs of their own, in the session's one trace.
    assert {s.context.trace_id for s in tools} == {uuid.UUID(str(session.id)).int}
