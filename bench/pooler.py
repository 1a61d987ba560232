"""Durable steps per second with 1, 2, 4 and 8 workers, each count straight to PostgreSQL
and through PgBouncer in transaction mode, and the PostgreSQL connections each needs.

    python -m bench.pooler [--workers 1 2 4 8] [--sessions 60] [--turns 15] [--repeat 3]
                           [--pool-size 4]

Real `manage.py rqworker` processes (Respawn's worker, the bench agent added: see
`_workers.py`) on a database of its own (respawn_bench_pooler) on the server DATABASE_URL
names, and its Redis. For each worker count, the workers are started once straight to
PostgreSQL, once through a PgBouncer of the bench's own (Debian's, transaction mode,
`--pool-size` server connections, RESPAWN_POOLER_SAFE=1) and once straight to PostgreSQL
with RESPAWN_POOLER_SAFE=1 (unprepared statements, no pooler: what the mode costs by
itself), each group on a queue of its own; then rounds of `--sessions` sessions of
`--turns` turns started at once go to the three in turn, `--repeat` each, so that load
from elsewhere on the machine falls on all three alike. Steps per second: durable steps
committed / (last step - first enqueue), the median of the rounds. Connections: the most
client backends PostgreSQL had open at once for each group (by application_name), and for
PgBouncer the most server connections its process held (sampled every 20 ms).
PgBouncer's CPU: its process's CPU seconds over the rounds through it, per durable step.
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

from ._db import database_name, fresh_database, setup_django

DB_NAME = "respawn_bench_pooler"


class ConnectionSampler(threading.Thread):
    """The most backends of the bench database PostgreSQL had at once: all of them (less the
    bench process's own and this sampler's), or per application_name, and the server
    connections a PgBouncer process held open at once."""

    def __init__(
        self, url: str, database: str, bouncer_pid: int | None = None, upstream_port: int = 5432
    ) -> None:
        from django.db import connection

        super().__init__(daemon=True)
        self.conn = psycopg.connect(url, autocommit=True)
        self.database = database
        self.bouncer_pid = bouncer_pid
        self.upstream_port = upstream_port
        with connection.cursor() as cursor:  # the bench process's own, left out
            cursor.execute("SELECT pg_backend_pid()")
            self.own = cursor.fetchone()[0]
        self.peak = 0
        self.peaks: dict[str, int] = {}
        self.stopped = threading.Event()

    def sample(self) -> None:
        rows = self.conn.execute(
            "SELECT application_name, count(*) FROM pg_stat_activity WHERE datname = %s"
            " AND backend_type = 'client backend' AND pid <> pg_backend_pid() AND pid <> %s"
            " GROUP BY application_name",
            [self.database, self.own],
        ).fetchall()
        self.peak = max(self.peak, sum(n for _, n in rows))
        for name, n in rows:
            self.peaks[name] = max(self.peaks.get(name, 0), n)
        if self.bouncer_pid:
            import psutil

            servers = sum(
                1
                for c in psutil.Process(self.bouncer_pid).net_connections("tcp")
                if c.raddr and c.status == "ESTABLISHED" and c.raddr.port == self.upstream_port
            )
            self.peaks["pgbouncer"] = max(self.peaks.get("pgbouncer", 0), servers)

    def run(self) -> None:
        while not self.stopped.wait(0.02):
            self.sample()

    def stop(self) -> int:
        self.stopped.set()
        self.join()
        self.conn.close()
        return self.peak


def one_round(sessions: int, turns: int) -> tuple[float, int]:
    """Steps per second of one round, and the steps."""
    from django.db.models import Max

    from sessions_app.models import AgentSession, Step

    from ._workers import start_session
    from .throughput import wait_final

    started = time.time()
    ids = [start_session(turns) for _ in range(sessions)]
    wait_final(ids, 600)
    failed = AgentSession.objects.filter(id__in=ids).exclude(status="completed").count()
    if failed:  # a rate of failed runs (a worker that cannot reach its database) means nothing
        raise SystemExit(f"{failed} of {sessions} sessions did not complete: see the worker logs")
    steps = Step.objects.filter(session_id__in=ids, seq__gt=1)
    last = steps.aggregate(last=Max("created_at"))["last"].timestamp()
    count = steps.count()
    return count / (last - started), count


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
    database = database_name(DB_NAME)
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
    # Straight to PostgreSQL as deployed without a pooler; straight to PostgreSQL with the
    # statements unprepared (what pooler-safe mode costs by itself); through PgBouncer.
    # Each on a queue of its own; the rounds of the three take turns.
    safe = {"RESPAWN_POOLER_SAFE": "1"}
    targets = {
        "direct": (f"{url}?application_name=bench-direct", {}),
        "unprepared": (f"{url}?application_name=bench-unprepared", safe),
        "pgbouncer": (bouncer.url(database), safe),
    }
    queues = {mode: f"{queue}-{mode}" for mode in targets}
    settings.RQ_QUEUES = {
        name: {"URL": redis_url, "DEFAULT_TIMEOUT": 3600} for name in [*queues.values(), "default"]
    }
    print(
        f"{os.cpu_count()} CPUs (shared with other work: load average "
        f"{os.getloadavg()[0]:.1f} at the start); PgBouncer {bouncer.pool_mode} mode, pool of "
        f"{args.pool_size}; {args.sessions} sessions x {args.turns} turns per round, "
        f"{args.repeat} rounds per mode, the modes taking turns",
        flush=True,
    )
    results: dict[tuple[int, str], dict[str, float]] = {}
    try:
        for n in args.workers:
            groups = {
                mode: [
                    Worker(
                        # No re-dispatch of another group's sessions by this group's reconciler.
                        worker_env(
                            target, redis_url, queues[mode], RESPAWN_DISPATCH_GRACE="600", **extra
                        ),  # fmt: skip
                        queues[mode],
                        f"bench-{mode}-{n}-{i}-{os.getpid()}",
                        log_dir,
                    )
                    for i in range(n)
                ]
                for mode, (target, extra) in targets.items()
            }
            rates: dict[str, list[float]] = {mode: [] for mode in targets}
            bouncer_cpu, bouncer_steps = 0.0, 0
            sampler = ConnectionSampler(
                url, database, bouncer.process.pid, int(db.get("PORT") or 5432)
            )
            sampler.start()
            try:
                wait_ready([w for group in groups.values() for w in group], redis_url)
                time.sleep(1.0)  # past the reconcilers' first pass
                for _ in range(args.repeat):
                    for mode in targets:
                        settings.RESPAWN_QUEUE = queues[mode]
                        cpu0 = _cpu(bouncer.process.pid)
                        rate, count = one_round(args.sessions, args.turns)
                        rates[mode].append(rate)
                        if mode == "pgbouncer":
                            bouncer_cpu += _cpu(bouncer.process.pid) - cpu0
                            bouncer_steps += count
            finally:
                for group in groups.values():
                    for w in group:
                        w.stop()
                sampler.stop()
            peaks = {
                "direct": sampler.peaks.get("bench-direct", 0),
                "unprepared": sampler.peaks.get("bench-unprepared", 0),
                "pgbouncer": sampler.peaks.get("pgbouncer", 0),
            }
            for mode in targets:
                results[n, mode] = {"rate": statistics.median(rates[mode]), "peak": peaks[mode]}
            results[n, "pgbouncer"]["cpu_ms"] = bouncer_cpu / bouncer_steps * 1000
            direct, bare, pooled = (results[n, m] for m in ("direct", "unprepared", "pgbouncer"))
            print(
                f"{n} worker(s): direct {direct['rate']:,.0f} steps/s with "
                f"{direct['peak']} connections; unprepared {bare['rate']:,.0f}; through "
                f"PgBouncer {pooled['rate']:,.0f} steps/s with {pooled['peak']} server "
                f"connections (ratio {pooled['rate'] / direct['rate']:.2f}; PgBouncer's own CPU "
                f"{pooled['cpu_ms']:.2f} ms a step); rounds: "
                + "; ".join(f"{m} " + " ".join(f"{r:,.0f}" for r in rates[m]) for m in targets),
                flush=True,
            )
    finally:
        bouncer.stop()
        from sessions_app.services.dispatch import queue as get_queue

        for name in queues.values():
            settings.RESPAWN_QUEUE = name
            get_queue().empty()

    print("\n| workers | direct steps/s | PostgreSQL connections | unprepared steps/s "
          "| through PgBouncer steps/s | server connections | pooled / direct "
          "| PgBouncer CPU per step |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for n in args.workers:
        d, u, p = (results[n, m] for m in ("direct", "unprepared", "pgbouncer"))
        print(
            f"| {n} | {d['rate']:,.0f} | {d['peak']} | {u['rate']:,.0f} | {p['rate']:,.0f} "
            f"| {p['peak']} | {p['rate'] / d['rate']:.2f} | {p['cpu_ms']:.2f} ms |"
        )


def _cpu(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


if __name__ == "__main__":
    main()
