"""What recording costs and telemetry add to a durable step, side by side in one process.

    python -m bench.costs [--steps 300] [--rounds 7]

Three variants of Respawn's real loop (`run_session`, DjangoSessionStore, PostgreSQL) run
the same session, interleaved in rounds (the order rotates, so a noisy neighbour hits all
alike):
- "no usage rows": the append writes no ModelUsage row (the costs page's totals) — the
  step path as it was before costs were summed;
- "usage rows": as shipped: a model step's append also upserts its session's row of the
  day (one more INSERT .. ON CONFLICT in the same statement);
- "usage + metrics": as shipped, with the worker's Prometheus counters and histograms (what
  every worker does);
- "usage + metrics + traces": also an OpenTelemetry tracer whose spans end in an
  in-memory exporter through the SDK's synchronous processor (a deployment's batch
  processor exports off the step's path), every hook called.

Printed: p50 ms per durable step per variant (median of rounds) and each variant's ratio
to "no usage rows" (median of the per-round ratios).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

from ._db import fresh_database, server_url, setup_django, with_db
from ._workload import Timings, warm

DB = "respawn_bench_costs"


def variants():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agent_runtime.telemetry import NO_TELEMETRY, combine
    from sessions_app import telemetry
    from sessions_app.store import base as store

    shipped = store.model_usage
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    observed = combine(
        [
            telemetry.PrometheusTelemetry(),
            telemetry.OpenTelemetryTelemetry(provider.get_tracer("bench")),
        ]
    )
    return {
        "no usage rows": (lambda steps: [], NO_TELEMETRY, exporter),
        "usage rows": (shipped, NO_TELEMETRY, exporter),
        "usage + metrics": (shipped, telemetry.PrometheusTelemetry(), exporter),
        "usage + metrics + traces": (shipped, observed, exporter),
    }


def run_variant(name: str, variant, turns: int, payload_bytes: int) -> float:
    from agent_runtime.loop import run_session
    from sessions_app.store import DjangoEffects
    from sessions_app.store import base as store

    from . import _respawn

    usage, observer, exporter = variant
    _respawn.truncate()
    exporter.clear()
    timings = Timings()
    session_id = _respawn.create_session(turns)
    shipped, store.model_usage = store.model_usage, usage
    try:
        timings.start()
        result = run_session(
            session_id,
            store=_respawn.timed_store(timings),
            agents=_respawn.agents(payload_bytes),
            effects=DjangoEffects(),
            config=replace(_respawn.run_config(), telemetry=observer),
            make_provider=_respawn.make_provider_factory(payload_bytes),
        )
    finally:
        store.model_usage = shipped
    assert result.outcome == "completed", result
    return timings.p50


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=300, help="steps per session (about)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--payload-bytes", type=int, default=256)
    args = parser.parse_args()
    url = fresh_database(DB)
    setup_django(url)
    print(f"server {with_db(server_url(), '')}  steps ~{args.steps}  rounds {args.rounds}")
    from ._respawn import turns_for

    turns = turns_for(args.steps)
    warm(turns, args.payload_bytes)
    all_variants = variants()
    names = list(all_variants)
    for name in names:  # warm-up: connections, prepared statements
        run_variant(name, all_variants[name], 3, args.payload_bytes)
    p50s: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            p50s[name].append(run_variant(name, all_variants[name], turns, args.payload_bytes))
        print(
            f"round {r + 1}/{args.rounds}: "
            + "  ".join(f"{name} {p50s[name][-1]:.3f}" for name in names),
            flush=True,
        )
        time.sleep(0.2)
    base = names[0]
    print(f"\n{'variant':28} {'p50 ms/step':>12} {'x ' + base:>18}")
    for name in names:
        ratios = [v / b for v, b in zip(p50s[name], p50s[base], strict=True)]
        print(f"{name:28} {statistics.median(p50s[name]):12.3f} {statistics.median(ratios):18.3f}")


if __name__ == "__main__":
    main()
