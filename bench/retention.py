"""A retention pass at scale: rows per second, the longest transaction, and what it does
to the latency of durable steps being written beside it.

    python -m bench.retention [--sessions 20000] [--steps 1000000] [--reuse]

Seeds a database of its own (respawn_bench_retention) the way bench.admin does (sessions
spread over 400 days, 80 % completed, checkpoints about every fourth step, one session of
100,000 steps), then:

1. appends steps to a live session for a while, alone: the baseline step latency;
2. `apply_retention --dry-run`: what the policy would delete and its bytes;
3. the real pass, while a thread keeps appending steps: rows deleted per second, the
   longest transaction, and the step latency during the pass, beside the baseline.

The policy: finished sessions older than 90 days go, checkpoints older than 7 days are
thinned to the last 3 and one a day, superseded steps older than 30 days are compacted.
Not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from ._db import database_url, fresh_database, setup_django

DB_NAME = "respawn_bench_retention"
POLICY = {
    "default": {
        "delete_after_days": 90,
        "checkpoints": {"after_days": 7, "keep_last": 3, "keep_daily": True},
        "superseded_after_days": 30,
    }
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Appender(threading.Thread):
    """Writes one durable step after another to a live session, timing each append."""

    def __init__(self, session_id: str) -> None:
        super().__init__(daemon=True)
        self.session_id = session_id
        self.latencies: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        from django.db import connections

        from agent_runtime.state import NewStep, StepKind
        from sessions_app.store import session_store

        store = session_store()
        lease = store.claim(self.session_id, "bench-appender", 3600)
        assert lease is not None, "the bench session could not be claimed"
        payload = {"event": "bench", "text": "x" * 200}
        try:
            while not self.stop.is_set():
                started = time.perf_counter()
                store.append(lease, [NewStep(kind=StepKind.SYSTEM, payload=payload)])
                self.latencies.append((time.perf_counter() - started) * 1000)
        finally:
            store.release(lease)
            connections.close_all()


def measure_steps(session_id: str, seconds: float) -> list[float]:
    appender = Appender(session_id)
    appender.start()
    time.sleep(seconds)
    appender.stop.set()
    appender.join()
    return appender.latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=20_000)
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--baseline-seconds", type=float, default=10.0)
    parser.add_argument("--reuse", action="store_true", help="keep the seeded database")
    args = parser.parse_args()

    if args.reuse:
        url = database_url(DB_NAME)
    else:
        from .admin import seed

        url = fresh_database(DB_NAME)
        print(f"seeding {args.sessions:,} sessions, {args.steps:,} steps ...", flush=True)
        seed(url, args.sessions, args.steps, newer=1)
    setup_django(url)

    from django.db import connection

    from sessions_app.models import AgentSession, Checkpoint, Status, Step
    from sessions_app.upkeep.retention import apply_retention, parse_policy

    def table_rows() -> dict[str, int]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT relname, n_live_tup FROM pg_stat_user_tables WHERE relname = ANY(%s)",
                [["sessions_app_step", "sessions_app_checkpoint", "sessions_app_agentsession"]],
            )
            return dict(cursor.fetchall())

    # A live session written to directly (no job: nothing is enqueued anywhere).
    live = AgentSession.objects.create(
        agent="echo", title="bench: the steps written beside retention", status=Status.RUNNING
    )
    counts = {
        "sessions": AgentSession.objects.count(),
        "steps": Step.objects.count(),
        "checkpoints": Checkpoint.objects.count(),
    }
    print(
        f"database: {counts['sessions']:,} sessions, {counts['steps']:,} steps, "
        f"{counts['checkpoints']:,} checkpoints",
        flush=True,
    )

    baseline = measure_steps(str(live.id), args.baseline_seconds)
    policy = parse_policy(POLICY)
    dry = apply_retention(policy, dry_run=True, batch_size=args.batch_size)
    print(
        f"dry run ({dry.seconds:.1f}s): would delete {dry.deleted_sessions.sessions:,} sessions "
        f"({dry.deleted_sessions.rows:,} steps and checkpoints), thin "
        f"{dry.checkpoints.rows:,} checkpoints of {dry.checkpoints.sessions:,} sessions, "
        f"compact {dry.superseded_steps.rows:,} steps; {dry.bytes / 2**20:.0f} MB of row data",
        flush=True,
    )

    appender = Appender(str(live.id))
    appender.start()
    done = apply_retention(policy, batch_size=args.batch_size)
    appender.stop.set()
    appender.join()
    during = appender.latencies
    rows = done.deleted_sessions.rows + done.checkpoints.rows + done.superseded_steps.rows
    print(
        f"retention pass: {rows:,} rows deleted in {done.seconds:.1f}s "
        f"({rows / max(done.seconds, 1e-9):,.0f} rows/s), "
        f"{done.deleted_sessions.sessions:,} sessions deleted, "
        f"{done.checkpoints.rows:,} checkpoints thinned; "
        f"longest transaction {done.longest_transaction * 1000:.0f} ms; "
        f"{done.bytes / 2**20:.0f} MB of row data freed",
        flush=True,
    )
    print(
        "durable step beside it (ms): "
        f"alone p50 {statistics.median(baseline):.2f} p99 {percentile(baseline, 0.99):.2f} "
        f"({len(baseline):,} steps); during the pass p50 {statistics.median(during):.2f} "
        f"p99 {percentile(during, 0.99):.2f} ({len(during):,} steps); "
        f"p50 ratio {statistics.median(during) / statistics.median(baseline):.2f}x",
        flush=True,
    )
    left = {
        "sessions": AgentSession.objects.count(),
        "steps": Step.objects.count(),
        "checkpoints": Checkpoint.objects.count(),
    }
    print(
        f"left: {left['sessions']:,} sessions, {left['steps']:,} steps, "
        f"{left['checkpoints']:,} checkpoints (statistics: {table_rows()})",
        flush=True,
    )


if __name__ == "__main__":
    main()
