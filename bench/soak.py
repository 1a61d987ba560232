"""Soak: hundreds of faults against real workers, then the loss figures.

    python -m bench.soak [--kills 200] [--sessions 40] [--ticks 8] [--workers 3]

On a database of its own (respawn_bench_soak) and a private Redis server, it starts real
`rqworker` processes and, until the kill budget is spent, injects one fault at a time:
SIGKILL of a busy worker (supervisor and worker process) at a random moment, SIGKILL right between a
tool call and its result, SIGKILL of the worker process only (its supervisor starts a new one), SIGSTOP past the lease then
SIGCONT, and Redis FLUSHALL. New sessions keep arriving. Afterwards every session is
checked against the trace of an uninterrupted run; it prints a table of the faults and of
lost steps, duplicated steps, duplicated side effects, unfinished sessions and the longest
recovery (a fault until the session's next committed step), and exits 1 unless the four
counts are 0.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from ._db import ROOT, fresh_database, setup_django

LEASE_TTL = 2.0
RECONCILE = 0.5


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument(
        "--sessions", type=int, default=150, help="sessions in all, arriving over the run"
    )
    parser.add_argument("--ticks", type=int, default=8)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--interval",
        type=float,
        nargs=2,
        default=(0.15, 0.6),
        metavar=("MIN", "MAX"),
        help="seconds between faults (uniform)",
    )
    args = parser.parse_args()
    rng = random.Random(args.seed)

    url = fresh_database("respawn_bench_soak")
    os.environ.update(
        RESPAWN_LEASE_TTL=str(LEASE_TTL),
        RESPAWN_RECONCILE_INTERVAL=str(RECONCILE),
        RESPAWN_DISPATCH_GRACE="2",
        RESPAWN_SLOW_DELAY="0.15",
        RESPAWN_PRODUCTION="0",
        RESPAWN_QUEUE="soak",
        RESPAWN_DB_POOL="0",
        # Poison detection off: 200 kills in a few minutes hit the same session several
        # times in a row before it writes a step, which is exactly what a poison session
        # looks like. tests/fault covers the detection itself.
        RESPAWN_MAX_CRASHES="1000",
    )
    from tests.servers import RedisServer

    workdir = Path(tempfile.mkdtemp(prefix="respawn-soak-"))
    redis = RedisServer(workdir).start()
    os.environ["REDIS_URL"] = redis.url
    setup_django(url)

    import psutil
    from django.db.models import Count

    from agent_runtime.loop import RunConfig, run_session
    from agent_runtime.store import InMemoryEffects, InMemoryStore
    from demo_agents import demo_agents
    from sessions_app.models import AgentSession, SideEffect, Status, Step
    from sessions_app.services.core import session_start

    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "PYTHONUNBUFFERED": "1",
    }
    logs = workdir / "logs"
    logs.mkdir()
    workers: list[subprocess.Popen] = []

    def start_worker() -> None:
        log = open(logs / f"w{len(workers)}.log", "wb")
        workers.append(
            subprocess.Popen(
                [sys.executable, "manage.py", "rqworker", "soak"],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )

    def family(worker):
        try:
            return [
                worker.pid,
                *(c.pid for c in psutil.Process(worker.pid).children(recursive=True)),
            ]
        except psutil.NoSuchProcess:
            return []

    def busy():
        """Workers whose process holds a lease (owner = host:pid:…)."""
        owners = AgentSession.objects.exclude(lease_owner__isnull=True).exclude(lease_owner="")
        pids = {int(owner.split(":")[1]) for owner in owners.values_list("lease_owner", flat=True)}
        return [w for w in workers if w.poll() is None and pids & set(family(w))]

    def kill(pids):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def last_seq(session_id):
        return AgentSession.objects.filter(id=session_id).values_list("last_seq", flat=True).first()

    text = f"count to {args.ticks}"
    reference_store = InMemoryStore()
    reference_store.create_session("ref", "slow", text)
    run_session(
        "ref",
        store=reference_store,
        agents=demo_agents(slow_delay=0),
        effects=InMemoryEffects(),
        config=RunConfig(worker_id="ref"),
    )
    reference = [
        (str(s.kind), s.payload) for s in reference_store.session("ref").steps if s.kind != "system"
    ]

    for _ in range(args.workers):
        start_worker()
    sessions = [session_start(agent="slow", input=text).id for _ in range(args.sessions // 2)]
    faults: Counter[str] = Counter()
    recoveries: list[float] = []
    pending_recovery: list[tuple[str, int, float]] = []  # session, seq at fault, when
    started = time.monotonic()
    kinds = [
        "sigkill-random",
        "sigkill-between-call-and-result",
        "sigkill-worker-process-only",
        "sigstop-past-lease",
        "redis-flushall",
    ]
    weights = [45, 25, 15, 10, 5]
    while sum(faults.values()) < args.kills:
        time.sleep(rng.uniform(*args.interval))
        # Keep the workers busy: about as many runnable sessions as workers, new ones arriving
        # as old ones finish (at most --sessions in all).
        runnable = AgentSession.objects.filter(
            id__in=sessions, status__in=[Status.QUEUED, Status.RUNNING]
        ).count()
        while runnable < args.workers + 1 and len(sessions) < args.sessions:
            sessions.append(session_start(agent="slow", input=text).id)
            runnable += 1
        for session_id, seq, at in list(pending_recovery):
            now_seq = last_seq(session_id)
            if now_seq is not None and now_seq > seq:
                recoveries.append(time.monotonic() - at)
                pending_recovery.remove((session_id, seq, at))
        candidates = busy()
        if not candidates:
            if runnable == 0 and len(sessions) >= args.sessions:
                break  # every session is done; the kill budget was not spent
            continue
        kind = rng.choices(kinds, weights)[0]
        worker = rng.choice(candidates)
        pids = family(worker)
        running = (
            AgentSession.objects.filter(lease_owner__contains=f":{pids[-1]}:")
            .values_list("id", "last_seq")
            .first()
        )
        if kind == "sigkill-between-call-and-result":
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline and running:
                last = (
                    Step.objects.filter(session_id=running[0])
                    .order_by("-seq")
                    .values_list("kind", flat=True)
                    .first()
                )
                if last == "tool_call":
                    break
                time.sleep(0.005)
        if kind == "redis-flushall":
            import redis as redis_client

            redis_client.Redis.from_url(os.environ["REDIS_URL"]).flushall()
        elif kind == "sigkill-worker-process-only":
            kill(pids[1:])
        elif kind == "sigstop-past-lease":
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            time.sleep(LEASE_TTL + 1.0)
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        else:
            kill(pids)
            start_worker()
        faults[kind] += 1
        if running and kind != "redis-flushall":
            pending_recovery.append((str(running[0]), last_seq(running[0]), time.monotonic()))
        if sum(faults.values()) % 25 == 0:
            print(f"  {sum(faults.values())} faults injected, {len(sessions)} sessions", flush=True)

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        for session_id, seq, at in list(pending_recovery):
            now_seq = last_seq(session_id)
            if now_seq is not None and now_seq > seq:
                recoveries.append(time.monotonic() - at)
                pending_recovery.remove((session_id, seq, at))
        if not AgentSession.objects.filter(
            id__in=sessions, status__in=[Status.QUEUED, Status.RUNNING]
        ).exists():
            break
        time.sleep(0.5)
    elapsed = time.monotonic() - started

    lost = duplicated = effects_dup = unfinished = steps_total = 0
    for session_id in sessions:
        session = AgentSession.objects.get(id=session_id)
        steps = list(Step.objects.filter(session_id=session_id).order_by("seq"))
        steps_total += len(steps)
        seqs = [s.seq for s in steps]
        if seqs != list(range(1, len(seqs) + 1)):
            duplicated += 1
        convo = [(s.kind, s.payload) for s in steps if s.kind != "system"]
        if session.status != Status.COMPLETED:
            unfinished += 1
        else:
            missing = len(reference) - len(convo)
            lost += max(0, missing)
            duplicated += max(0, -missing)
            if missing == 0 and convo != reference:
                duplicated += sum(1 for a, b in zip(convo, reference, strict=True) if a != b)
        effects = SideEffect.objects.filter(session_id=session_id)
        effects_dup += effects.values("key").annotate(n=Count("id")).filter(n__gt=1).count()
        if session.status == Status.COMPLETED:
            effects_dup += max(0, effects.count() - args.ticks)
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            worker.wait(timeout=10)
        except subprocess.TimeoutExpired:
            worker.kill()
    redis.stop()

    print(
        f"\nsoak: {sum(faults.values())} faults over {len(sessions)} sessions in {elapsed:.0f}s "
        f"(lease TTL {LEASE_TTL:g}s, reconciler every {RECONCILE:g}s, {args.workers} workers)"
    )
    print(f"\n{'fault':36} {'count':>6}")
    for kind in kinds:
        print(f"{kind:36} {faults[kind]:6d}")
    print(f"\n{'sessions':36} {len(sessions):6d}")
    print(f"{'steps':36} {steps_total:6d}")
    print(f"{'lost steps':36} {lost:6d}")
    print(f"{'duplicated or skipped steps':36} {duplicated:6d}")
    print(f"{'duplicated side effects':36} {effects_dup:6d}")
    print(f"{'sessions left unfinished':36} {unfinished:6d}")
    if recoveries:
        recoveries.sort()
        print(f"{'recovery median (s)':36} {recoveries[len(recoveries) // 2]:6.2f}")
        print(f"{'recovery longest (s)':36} {recoveries[-1]:6.2f}")
    print(f"{'recoveries still pending at the end':36} {len(pending_recovery):6d}")
    if lost or duplicated or effects_dup or unfinished:
        raise SystemExit("steps or side effects lost or doubled, or sessions unfinished: above")


if __name__ == "__main__":
    main()
