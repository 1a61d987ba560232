"""Migration 0028 on a large database: checkpoint states from jsonb to compact JSON text,
in batches, while workers append.

    python -m bench.state_text [--steps 1000000] [--appenders 2] [--batch 5000] [--keep]

Builds a database of its own (respawn_bench_state_text) at the migration before 0028
with `--steps` steps in sessions of 300 (one checkpoint every third step: a turn's), then
runs the migration exactly as `manage.py migrate` does while `--appenders` threads append
steps with checkpoints through the store (what workers do meanwhile). Prints how long the
conversion took, the longest any one of its transactions held, the swap's lock, the
appenders' append times before and during it (p50, p99, max: what a worker waited), and
the checkpoint table's size before and after (VACUUM FULL'd: what the rows take, not the
dead versions the batches leave, which autovacuum reclaims).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import psycopg

from ._db import drop_database, fresh_database, setup_django
from .upgrade import LongestTransaction, v1_state

BENCH_DB = "respawn_bench_state_text"
STEPS_PER_SESSION = 300


def build(url: str, steps: int) -> int:
    """`steps` steps and a checkpoint every third step, straight into the tables with SQL
    (the states today's shape, written as jsonb as the release before 0028 stored them).
    Returns the number of checkpoints."""
    from agent_runtime.state import SCHEMA_VERSION

    sessions = max(1, steps // STEPS_PER_SESSION)
    per = min(steps, STEPS_PER_SESSION)
    state = v1_state(7)
    state["schema_version"] = SCHEMA_VERSION
    from sessions_app.models import AgentSession, Status

    ids = [
        AgentSession(agent="demo", status=Status.COMPLETED, head=per, last_seq=per, step_count=per)
        for _ in range(sessions)
    ]
    AgentSession.objects.bulk_create(ids, batch_size=1000)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE bench_sessions (n serial, id uuid)")
        with conn.cursor().copy("COPY bench_sessions (id) FROM STDIN") as copy:
            for session in ids:
                copy.write_row((session.id,))
        conn.execute(
            "INSERT INTO sessions_app_step (session_id, seq, kind, payload, schema_version,"
            " started_at, finished_at, tokens_in, tokens_out, created_at)"
            " SELECT b.id, q, 'tool_result',"
            " jsonb_build_object('call_id', 'call_' || q, 'name', 'echo', 'status', 'ok',"
            " 'output', repeat('x', 200), 'error', null, 'attempts', 1), %s, now(), now(),"
            " 0, 0, now()"
            " FROM bench_sessions b, generate_series(1, %s) q",
            [SCHEMA_VERSION, per],
        )
        conn.execute(
            "INSERT INTO sessions_app_checkpoint (session_id, seq, state, schema_version,"
            " reason, created_at)"
            " SELECT b.id, q, jsonb_set(%s::jsonb, '{counters,steps}',"
            " to_jsonb(q)), %s, 'auto', now()"
            " FROM bench_sessions b, generate_series(3, %s, 3) q",
            [json.dumps(state), SCHEMA_VERSION, per],
        )
        conn.execute("VACUUM ANALYZE")
        return conn.execute("SELECT count(*) FROM sessions_app_checkpoint").fetchone()[0]


def table_mb(url: str) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM FULL sessions_app_checkpoint")
        size = conn.execute("SELECT pg_total_relation_size('sessions_app_checkpoint')").fetchone()[
            0
        ]
    return size / 2**20


class Appender(threading.Thread):
    """A worker's appends: a step with its checkpoint, one after the other, timed."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stopped = threading.Event()
        self.ms: list[tuple[float, float]] = []  # (when, ms)
        self.error: BaseException | None = None

    def run(self) -> None:
        from django.db import connections

        from agent_runtime.state import NewCheckpoint, NewStep, SessionState, StepKind, user_payload
        from sessions_app.models import AgentSession
        from sessions_app.store import session_store

        try:
            session = AgentSession.objects.create(agent="echo", last_seq=0)
            store = session_store()
            lease = store.claim(str(session.id), "appender", 120)
            state = SessionState("echo", "1")
            while not self.stopped.is_set():
                state.counters.tokens_in += 1
                at = time.perf_counter()
                store.append(
                    lease,
                    [NewStep(kind=StepKind.USER, payload=user_payload("hi"))],
                    checkpoint=NewCheckpoint(state=state),
                )
                self.ms.append((at, (time.perf_counter() - at) * 1000))
                time.sleep(0.005)
        except BaseException as exc:  # noqa: BLE001 - reported by main()
            self.error = exc
        finally:
            connections.close_all()


def summary(values: list[float]) -> str:
    if not values:
        return "no appends"
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return (
        f"{len(values):5d} appends: p50 {statistics.median(values):7.2f} ms, "
        f"p99 {p99:7.2f} ms, max {ordered[-1]:7.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--appenders", type=int, default=2)
    parser.add_argument("--batch", type=int, default=5000, help="rows per transaction")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args()

    url = fresh_database(BENCH_DB, migrate=False)
    setup_django(url)
    from django.core.management import call_command
    from django.db import connections

    from sessions_app.upkeep import state_text

    try:
        call_command("migrate", "sessions_app", "0027", verbosity=0)
        call_command("migrate", "auth", verbosity=0)
        started = time.monotonic()
        checkpoints = build(url, args.steps)
        print(
            f"state_text: {args.steps:,} steps, {checkpoints:,} checkpoints as jsonb "
            f"(built in {time.monotonic() - started:.1f}s), batches of {args.batch}",
            flush=True,
        )
        before_mb = table_mb(url)
        state_text.BATCH = args.batch  # what the migration converts with
        appenders = [Appender() for _ in range(args.appenders)]
        for appender in appenders:
            appender.start()
        time.sleep(1.0)  # appends before the conversion, for comparison
        with LongestTransaction(url, BENCH_DB) as watch:
            began = time.perf_counter()
            call_command("migrate", "sessions_app", "0028", verbosity=0)
            ended = time.perf_counter()
        print(flush=True)  # after the migration's progress lines
        time.sleep(1.0)
        for appender in appenders:
            appender.stopped.set()
            appender.join()
        errors = [a.error for a in appenders if a.error is not None]
        assert not errors, errors
        assert state_text.column_type() == "json"
        done = state_text.LAST
        assert done is not None
        before = [ms for a in appenders for at, ms in a.ms if at < began]
        during = [ms for a in appenders for at, ms in a.ms if began <= at < ended]
        after_mb = table_mb(url)
        print(
            f"  migration 0028: {done.rows:,} states in {ended - began:.1f}s"
            f" ({done.rows / max(ended - began, 1e-9):,.0f} rows/s, {done.batches} batches);"
            f" longest transaction {watch.longest:.3f}s; the swap's lock {done.swap_ms:.1f} ms"
        )
        print(f"  appends before: {summary(before)}")
        print(f"  appends during: {summary(during)}")
        print(
            f"  checkpoint table: {before_mb:.1f} MB as jsonb, {after_mb:.1f} MB as json text"
            f" ({after_mb / before_mb:.2f}x)"
        )
        print(f"longest_wait_ms: {max(during, default=0.0):.1f}")
    finally:
        connections.close_all()
        if not args.keep:
            drop_database(BENCH_DB)


if __name__ == "__main__":
    main()
