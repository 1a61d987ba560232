"""State upgrade throughput: rewrite N stored v1 checkpoints to the current schema version in
PostgreSQL, through the data migration (forward and reverse) and through upgrade_state.
Prints rows per second and the longest transaction each took.

    python -m bench.upgrade [--rows 100000] [--batch-size 500] [--keep]

Creates its own database (respawn_bench_upgrade) on the server DATABASE_URL points at and
drops it afterwards (unless --keep). A benchmark, not a test: nothing here is asserted
beyond "every row ended up at the version it should".
"""

from __future__ import annotations

import argparse
import importlib
import json
import threading
import time
import uuid
from datetime import UTC, datetime

import psycopg

from ._db import database_name, drop_database, fresh_database, setup_django

BENCH_DB = "respawn_bench_upgrade"
CHECKPOINTS_PER_SESSION = 100
MIGRATION_0009_TARGET = 2  # the version 0009 rewrites to, as released (0015 goes on to v3)


def v1_state(n: int) -> dict:
    """A v1 checkpoint state like the demo agents write, varied a little per row."""
    items = 1 + n % 5
    return {
        "schema_version": 1,
        "agent": {"name": "demo", "version": "1"},
        "turn": n % 40,
        "plan": [
            {
                "title": f"step {i} of the plan for task {n}",
                "status": "done" if i < 2 else "pending",
            }
            for i in range(items)
        ],
        "memory_refs": [f"note-{n}-{i}" for i in range(n % 3)],
        "counters": {
            "steps": n % 200,
            "model_calls": n % 40,
            "tool_calls": n % 80,
            "tokens_in": 25 * (n % 400),
            "tokens_out": 30 * (n % 400),
            "cost": 0.0,
            "retries": n % 2,
        },
        "budgets": {"max_steps": 200, "max_tokens": None, "max_cost": None},
        "pending_approval": None,
        "uncertain_calls": [],
        "batch_cursor": None,
        "final_answer": None if n % 7 else f"answer {n}",
    }


class LongestTransaction(threading.Thread):
    """Samples pg_stat_activity: the oldest open transaction on the bench database."""

    def __init__(self, url: str, database: str = BENCH_DB) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.database = database
        self.longest = 0.0
        self.stopped = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stopped.wait(0.005):
                age = conn.execute(
                    "SELECT coalesce(max(extract(epoch FROM clock_timestamp() - xact_start)), 0)"
                    " FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
                    " AND xact_start IS NOT NULL",
                    (database_name(self.database),),
                ).fetchone()[0]
                self.longest = max(self.longest, float(age))

    def __enter__(self) -> LongestTransaction:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.join()


def models_at(migration: str):
    """The models as migration `migration` of sessions_app left them: the bench database sits
    there while it is measured, without the columns later migrations add."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    state = MigrationExecutor(connection).loader.project_state(("sessions_app", migration))
    return state.apps


def load_v1_checkpoints(rows: int, AgentSession) -> None:  # noqa: N803 (a model class)
    from django.db import connection

    sessions = [uuid.uuid4() for _ in range(max(1, -(-rows // CHECKPOINTS_PER_SESSION)))]
    AgentSession.objects.bulk_create(
        [AgentSession(id=sid, agent="demo", status="running") for sid in sessions],
        batch_size=1000,
    )
    now = datetime.now(UTC)
    connection.ensure_connection()
    with connection.connection.cursor() as cursor:
        with cursor.copy(
            "COPY sessions_app_checkpoint (session_id, seq, state, schema_version, reason, "
            "created_at) FROM STDIN"
        ) as copy:
            for n in range(rows):
                session = sessions[n // CHECKPOINTS_PER_SESSION]
                seq = n % CHECKPOINTS_PER_SESSION + 1
                copy.write_row((session, seq, json.dumps(v1_state(n)), 1, "auto", now))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE sessions_app_checkpoint")


def versions(Checkpoint) -> dict[int, int]:  # noqa: N803 (a model class)
    from django.db.models import Count

    return dict(Checkpoint.objects.values_list("schema_version").annotate(n=Count("id")).order_by())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="v1 checkpoints to upgrade")
    parser.add_argument("--batch-size", type=int, default=500, help="rows per transaction")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args()

    bench_url = fresh_database(BENCH_DB, migrate=False)  # migrated below, up to 0008 first
    setup_django(bench_url)
    from django.core.management import call_command
    from django.db import connections

    from agent_runtime.state import SCHEMA_VERSION
    from sessions_app.upkeep.state_upgrade import upgrade_blobs

    migration = importlib.import_module("sessions_app.migrations.0009_upgrade_state_blobs")
    migration.BATCH_SIZE = args.batch_size
    try:
        call_command("migrate", "sessions_app", "0008", verbosity=0)
        apps = models_at("0008_session_incompatible")
        Checkpoint = apps.get_model("sessions_app", "Checkpoint")  # noqa: N806 (a model class)
        Step = apps.get_model("sessions_app", "Step")  # noqa: N806 (a model class)
        started = time.monotonic()
        load_v1_checkpoints(args.rows, apps.get_model("sessions_app", "AgentSession"))
        print(
            f"state upgrade: {args.rows:,} v1 checkpoints in PostgreSQL "
            f"(loaded in {time.monotonic() - started:.1f}s), batches of {args.batch_size}"
        )

        def report(label: str, seconds: float, longest: float, extra: str = "") -> None:
            print(
                f"  {label:<26} {args.rows:,} rows in {seconds:6.2f}s = "
                f"{args.rows / seconds:9,.0f} rows/s; longest transaction {longest:.3f}s{extra}"
            )

        with LongestTransaction(bench_url) as watch:
            started = time.monotonic()
            call_command("migrate", "sessions_app", "0009", verbosity=0)
            seconds = time.monotonic() - started
        assert versions(Checkpoint) == {MIGRATION_0009_TARGET: args.rows}, versions(Checkpoint)
        report("migration 0009 forward", seconds, watch.longest)

        with LongestTransaction(bench_url) as watch:
            started = time.monotonic()
            call_command("migrate", "sessions_app", "0008", verbosity=0)
            seconds = time.monotonic() - started
        assert versions(Checkpoint) == {1: args.rows}, versions(Checkpoint)
        report("migration 0009 reverse", seconds, watch.longest)

        with LongestTransaction(bench_url) as watch:
            summary = upgrade_blobs(Checkpoint, Step, batch_size=args.batch_size)
        table = summary.tables[0]
        assert table.upgraded == args.rows, table
        assert versions(Checkpoint) == {SCHEMA_VERSION: args.rows}, versions(Checkpoint)
        report(
            f"upgrade_state (to v{SCHEMA_VERSION})",
            summary.seconds,
            watch.longest,
            f" (timed inside: {table.max_transaction_seconds:.3f}s, "
            f"at most {table.max_transaction_rows} rows)",
        )
        # Up to the latest: 0009 and 0015 find every row current and rewrite none.
        call_command("migrate", "sessions_app", verbosity=0)
    finally:
        connections.close_all()
        if not args.keep:
            drop_database(BENCH_DB)


if __name__ == "__main__":
    main()
