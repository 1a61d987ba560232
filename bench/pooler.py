"""Durable steps per second with 1, 2, 4 and 8 workers, each count straight to PostgreSQL
and through PgBouncer in transaction mode, and the PostgreSQL connections each needs.

    python -m bench.pooler [--workers 1 2 4 8] [--sessions 60] [--turns 15] [--repeat 3]
                           [--pool-size 4]

Real `manage.py rqworker` processes (Respawn's worker, the bench agent added: see
`_workers.py`) on a database of its own (respawn_bench_pooler) on the server DATABASE_URL
names, and its Redis. For each worker count, the workers are started once straight to
PostgreSQL and once through a PgBouncer of the bench's own (Debian's, transaction mode,
`--pool-size` server connections, RESPAWN_POOLER_SAFE=1); the two take turns, `--repeat`
rounds each of `--sessions` sessions of `--turns` turns started at once. Steps per second:
durable steps committed / (last step - first enqueue). Connections: the most client
backends PostgreSQL had open on the bench database at once while the workers ran (sampled
every 20 ms), the bench process's own left out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import psycopg

from ._db import fresh_database, setup_django

DB_NAME = "respawn_bench_pooler"


class ConnectionSampler(threading.Thread):
    """The most backends of the bench database PostgreSQL had at once."""

    def __init__(self, url: str, database: str) -> None:
        from django.db import connection

        super().__init__(daemon=True)
        self.conn = psycopg.connect(url, autocommit=True)
        self.database = database
        with connection.cursor() as cursor:  # the bench process's own, left out
            cursor.execute("SELECT pg_backend_pid()")
            self.own = cursor.fetchone()[0]
        self.peak = 0
        self.stopped = threading.Event()

    def sample(self) -> int:
        return self.conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
            " AND backend_type = 'client backend' AND pid <> pg_backend_pid() AND pid <> %s",
            [self.database, self.own],
        ).fetchone()[0]

    def run(self) -> None:
        while not self.stopped.wait(0.02):
            self.peak = max(self.peak, self.sample())

    def stop(self) -> int:
        self.stopped.set()
        self.join()
        self.conn.close()
        return self.peak


def one_round(sessions: int, turns: int) -> float:
    from django.db.models import Max

    from sessions_app.models import Step

    from ._workers import start_session
    from .throughput import wait_final

    started = time.time()
    ids = [start_session(turns) for _ in range(sessions)]
    wait_final(ids, 600)
    steps = Step.objects.filter(session_id__in=ids, seq__gt=1)
    last = steps.aggregate(last=Max("created_at"))["last"].timestamp()
    return steps.count() / (last - started)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--sessions", type=int, default=60)
    parser.add_argument("--turns", type=int, default=15)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pool-size", type=int, default=4, help="PgBouncer's server pool")
    args = parser.parse_args()

    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/11")
    queue = f"bench-pooler-{os.getpid()}"
    os.environ.update(REDIS_URL=redis_url, RESPAWN_QUEUE=queue)
    url = fresh_database(DB_NAME)
    setup_django(url)
    from django.conf import settings

    from tests.servers import PgBouncer

    from ._workers import Worker, install_bench_agent, wait_ready, worker_env

    install_bench_agent()
    db = settings.DATABASES["default"]
    bouncer = PgBouncer(db.get("HOST") or "127.0.0.1", db.get("PORT") or 5432,
                        pool_size=args.pool_size)  # fmt: skip
    bouncer.start()
    log_dir = Path(tempfile.mkdtemp(prefix="respawn-bench-"))
    modes = {
        "direct": worker_env(url, redis_url, queue),
        "pgbouncer": worker_env(bouncer.url(DB_NAME), redis_url, queue, RESPAWN_POOLER_SAFE="1"),
    }
    print(
        f"{os.cpu_count()} CPUs; PgBouncer {bouncer.pool_mode} mode, pool of {args.pool_size}; "
        f"{args.sessions} sessions x {args.turns} turns per round, {args.repeat} rounds",
        flush=True,
    )
    results: dict[tuple[int, str], dict[str, float]] = {}
    try:
        for n in args.workers:
            rates: dict[str, list[float]] = {mode: [] for mode in modes}
            peaks: dict[str, int] = {}
            for mode, env in modes.items():
                sampler = ConnectionSampler(url, DB_NAME)
                sampler.start()
                workers = [
                    Worker(env, queue, f"bench-{mode}-{n}-{i}-{os.getpid()}", log_dir)
                    for i in range(n)
                ]
                try:
                    wait_ready(workers, redis_url)
                    time.sleep(1.0)  # past the reconcilers' first pass
                    for _ in range(args.repeat):
                        rates[mode].append(one_round(args.sessions, args.turns))
                finally:
                    for w in workers:
                        w.stop()
                peaks[mode] = sampler.stop()
            for mode in modes:
                results[n, mode] = {"rate": statistics.median(rates[mode]), "peak": peaks[mode]}
            direct, pooled = results[n, "direct"], results[n, "pgbouncer"]
            print(
                f"{n} worker(s): direct {direct['rate']:,.0f} steps/s with "
                f"{direct['peak']} connections; through PgBouncer {pooled['rate']:,.0f} "
                f"steps/s with {pooled['peak']} server connections "
                f"(ratio {pooled['rate'] / direct['rate']:.2f})",
                flush=True,
            )
    finally:
        bouncer.stop()
        from sessions_app.dispatch import queue as get_queue

        get_queue().empty()

    print("\n| workers | direct steps/s | PostgreSQL connections | through PgBouncer steps/s "
          "| server connections | pooled / direct |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for n in args.workers:
        d, p = results[n, "direct"], results[n, "pgbouncer"]
        print(
            f"| {n} | {d['rate']:,.0f} | {d['peak']} | {p['rate']:,.0f} | {p['peak']} "
            f"| {p['rate'] / d['rate']:.2f} |"
        )


if __name__ == "__main__":
    main()
