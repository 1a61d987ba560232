"""Traces and metrics from real rqworker processes: spans exported over OTLP/HTTP (to a
local collector that decodes what the SDK's exporter sends), one trace for a session whose
first worker is SIGKILLed mid-run, and each worker's own metrics port scraped."""

from __future__ import annotations

import urllib.request
import uuid

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client.parser import text_string_to_metric_families

from sessions_app.models import Status, Step
from sessions_app.services.core import session_start

from ..conftest import wait_for, wait_for_status
from ..servers import free_port
from ..stubs.loopback import QuietHandler, loopback_server, serve_in_background

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


class Collector:
    """An OTLP/HTTP trace receiver: keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list = []
        collector = self

        class Handler(QuietHandler):
            def do_POST(self):  # noqa: N802 - the http.server interface
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                for resource in request.resource_spans:
                    for scope in resource.scope_spans:
                        collector.spans.extend(scope.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

        self.server = serve_in_background(loopback_server(Handler))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def named(self, prefix: str) -> list:
        return [s for s in self.spans if s.name.startswith(prefix)]


def attributes(span) -> dict:
    out = {}
    for item in span.attributes:
        value = item.value
        out[item.key] = getattr(value, value.WhichOneof("value"))
    return out


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name + "".join(f"|{k}={v}" for k, v in sorted(sample.labels.items()))
            out[key] = sample.value
    return out


def test_a_session_killed_mid_run_is_one_trace_and_each_worker_serves_its_metrics(start_worker):
    collector = Collector()
    port = free_port()
    env = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_SERVICE_NAME": "respawn-worker-test",
        "RESPAWN_WORKER_METRICS_PORT": str(port),
        "RESPAWN_SLOW_DELAY": "0.4",
    }
    first = start_worker(**env)
    session = session_start(agent="slow", input="count to 10")
    wait_for(
        lambda: Step.objects.filter(session=session, kind="tool_result").count() >= 3,
        timeout=60,
        what="three counts",
    )
    metrics = wait_for(lambda: _try_scrape(port), timeout=20, what="the worker's metrics")
    assert metrics["respawn_steps_total|kind=tool_result"] >= 3
    assert metrics["respawn_model_calls_total|model=slow|outcome=ok|provider=scripted"] >= 3
    # Spans of the first run's model and tool calls are exported as they end.
    wait_for(lambda: collector.named("chat"), timeout=20, what="chat spans of the first run")
    first.kill()

    start_worker(**env)
    wait_for_status(session, Status.COMPLETED, timeout=90)
    wait_for(lambda: collector.named("invoke_agent"), timeout=20, what="the second run's span")

    trace_id = uuid.UUID(str(session.id)).bytes
    assert {s.trace_id for s in collector.spans} == {trace_id}
    (run,) = collector.named("invoke_agent")  # the killed run's span never ended
    run_attributes = attributes(run)
    assert run_attributes["gen_ai.conversation.id"] == str(session.id)
    assert run_attributes["respawn.recovering"] is True
    assert run_attributes["respawn.outcome"] == "completed"
    assert [e.name for e in run.events if e.name == "recovery"] == ["recovery"]
    chats = collector.named("chat")
    # Chat spans of both runs: the killed run's hang off its own (lost) run span.
    assert {c.parent_span_id for c in chats} >= {run.span_id}
    assert len({c.parent_span_id for c in chats}) == 2
    model_steps = Step.objects.filter(session=session, kind="model").count()
    # One span per call: a call the kill stopped before its step was written may have one
    # span more than the steps say.
    assert model_steps <= len(chats) + 1 and len(chats) <= model_steps + 1
    assert all(attributes(c)["gen_ai.provider.name"] == "scripted" for c in chats)

    # The second worker took the next free port (the first one's may still be held).
    second = wait_for(
        lambda: _try_scrape(port) or _try_scrape(port + 1), timeout=20, what="metrics"
    )
    assert second["respawn_recoveries_total|agent=slow"] == 1
    assert second["respawn_runs_total|agent=slow|outcome=completed"] == 1


def _try_scrape(port: int) -> dict[str, float] | None:
    try:
        return scrape(port)
    except OSError:
        return None
