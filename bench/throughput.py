"""Real RQ workers: enqueue-to-first-step latency, and durable steps per second in total.

    python -m bench.throughput [--workers 2] [--sessions 100] [--turns 30] [--latency 30]
                               [--fork]

Starts `--workers` real `manage.py rqworker` processes (Respawn's worker: a supervisor and
a long-lived worker process that runs the jobs; Respawn's job, store, lease, heartbeat and
reconciler; the bench agent added, see `_workers.py`) on a database of its own and a queue
of its own, then:

1. latency: `--latency` one-turn sessions, one at a time, each started the way the
   dashboard and the API start one (`services.session_start`: the row, the user step,
   enqueue after commit). Enqueue -> job start is RQ (BLPOP wake-up and its job
   bookkeeping; with --fork, RQ's default fork of a work horse per job too); enqueue -> first step is the worker's first durable step (the run_started
   step, committed; its created_at is taken just before its statement is sent).
2. throughput: `--sessions` sessions of `--turns` turns (three steps a turn) started at
   once; total steps the workers committed divided by the time from the first enqueue to
   the last step.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time
from pathlib import Path

from ._db import fresh_database, setup_django

DB_NAME = "respawn_bench_throughput"


def _job_times(job_id: str):
    from rq.job import Job

    from sessions_app.services.dispatch import queue

    job = Job.fetch(job_id, connection=queue().connection)
    return job.enqueued_at, job.started_at


def wait_final(session_ids: list[str], timeout: float) -> None:
    from sessions_app.models import FINAL, AgentSession

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = AgentSession.objects.filter(id__in=session_ids).exclude(status__in=FINAL).count()
        if not left:
            return
        time.sleep(0.02)
    raise TimeoutError(f"{left} session(s) not finished after {timeout:g}s")


def latency(n: int) -> dict[str, float]:
    from sessions_app.models import AgentSession, Step

    from ._workers import start_session

    to_start, to_step = [], []
    for _ in range(n):
        sid = start_session(1)
        wait_final([sid], 60)
        job_id = AgentSession.objects.get(id=sid).job_id
        enqueued, started = _job_times(job_id)
        first = Step.objects.get(session_id=sid, seq=2).created_at
        to_start.append((started - enqueued).total_seconds() * 1000)
        to_step.append((first - enqueued.replace(tzinfo=first.tzinfo)).total_seconds() * 1000)
        time.sleep(0.05)
    return {
        "start_p50": statistics.median(to_start),
        "step_p50": statistics.median(to_step),
        # Nearest rank: the 27th of 30; int(0.9 * n) - 1 alone gave the least of 2 or 5.
        "step_p90": sorted(to_step)[math.ceil(0.9 * len(to_step)) - 1],
        "step_max": max(to_step),
    }


def _machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, every process of every user."""
    fields = [float(x) for x in open("/proc/stat").readline().split()[1:]]
    idle = fields[3] + fields[4]
    total = sum(fields[:8])
    return (total - idle) / os.sysconf("SC_CLK_TCK"), total / os.sysconf("SC_CLK_TCK")


def _workers_cpu(workers) -> float:
    """CPU seconds of the worker processes: supervisors, their live worker processes, and
    any that ended (work horses forked per job, with --fork)."""
    import psutil

    total = 0.0
    for w in workers:
        parent = psutil.Process(w.process.pid)
        for process in (parent, *parent.children(recursive=True)):
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:  # a work horse that just ended: in its parent's
                continue
            total += times.user + times.system + times.children_user + times.children_system
    return total


def throughput(sessions: int, turns: int, workers) -> dict[str, float]:
    from django.db.models import Max, Min, Sum

    from sessions_app.models import AgentSession, Step

    from ._workers import start_session

    busy0, total0 = _machine_busy()
    cpu0 = _workers_cpu(workers)
    started = time.time()
    ids = [start_session(turns) for _ in range(sessions)]
    wait_final(ids, 600)
    busy1, total1 = _machine_busy()
    cpu1 = _workers_cpu(workers)
    steps = Step.objects.filter(session_id__in=ids, seq__gt=1)
    span = steps.aggregate(first=Min("created_at"), last=Max("created_at"))
    total = steps.count()
    completed = AgentSession.objects.filter(id__in=ids, status="completed").count()
    wall = span["last"].timestamp() - started
    hot = _hot_updates()
    return {
        "steps": total,
        "completed": completed,
        "wall": wall,
        "steps_per_s": total / wall,
        "steps_per_s_active": total / (span["last"] - span["first"]).total_seconds(),
        "session_steps": AgentSession.objects.filter(id__in=ids).aggregate(s=Sum("last_seq"))["s"],
        "machine_busy": (busy1 - busy0) / (total1 - total0),
        "workers_cpu_per_step": (cpu1 - cpu0) / total * 1000,
        "machine_cpu_per_step": (busy1 - busy0) / total * 1000,
        **hot,
    }


def _hot_updates() -> dict[str, float]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
            " WHERE relname = 'sessions_app_agentsession'"
        )
        upd, hot = cursor.fetchone()
    return {"session_updates": upd, "hot_share": hot / upd if upd else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--latency", type=int, default=30, help="sessions for the latency test")
    parser.add_argument(
        "--fork",
        action="store_true",
        help="fork a work horse per job (RQ's default) instead of running jobs in process",
    )
    args = parser.parse_args()

    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/11")
    queue = f"bench-throughput-{os.getpid()}"
    os.environ.update(REDIS_URL=redis_url, RESPAWN_QUEUE=queue)
    url = fresh_database(DB_NAME)
    setup_django(url)
    from ._workers import Worker, install_bench_agent, wait_ready, worker_env

    install_bench_agent()
    log_dir = Path(tempfile.mkdtemp(prefix="respawn-bench-"))
    env = worker_env(url, redis_url, queue)
    worker_class = "bench._workers." + ("BenchForkingWorker" if args.fork else "BenchWorker")
    workers = [
        Worker(env, queue, f"bench-w{i + 1}-{os.getpid()}", log_dir, worker_class)
        for i in range(args.workers)
    ]
    print(f"{args.workers} x rqworker --worker-class {worker_class}", flush=True)
    try:
        wait_ready(workers, redis_url)
        time.sleep(1.0)  # past the reconcilers' first pass
        lat = latency(args.latency)
        print(
            f"enqueue -> job start             p50 {lat['start_p50']:.1f} ms\n"
            f"enqueue -> first durable step    p50 {lat['step_p50']:.1f} ms   "
            f"p90 {lat['step_p90']:.1f} ms   max {lat['step_max']:.1f} ms   ({args.latency} sessions)",
            flush=True,
        )
        tp = throughput(args.sessions, args.turns, workers)
        print(
            f"{args.workers} workers, {args.sessions} sessions x {args.turns} turns: "
            f"{tp['steps']:,} durable steps in {tp['wall']:.2f} s = "
            f"{tp['steps_per_s']:,.0f} steps/s ({tp['completed']}/{args.sessions} completed; "
            f"session-row updates HOT: {tp['hot_share']:.0%})"
        )
        print(
            f"CPU: the machine was {tp['machine_busy']:.0%} busy (all processes, all users); "
            f"per step: workers {tp['workers_cpu_per_step']:.2f} ms, whole machine "
            f"{tp['machine_cpu_per_step']:.2f} ms"
        )
        print(f"enqueue_to_first_step_ms: {lat['step_p50']:.1f}")
        print(f"steps_per_second: {tp['steps_per_s']:.0f}")
    finally:
        for w in workers:
            w.stop()
        from sessions_app.services.dispatch import queue as get_queue

        get_queue().empty()


if __name__ == "__main__":
    main()
