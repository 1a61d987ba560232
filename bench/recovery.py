"""Recovery after a worker is SIGKILLed, and resume of a long session.

    python -m bench.recovery [--rounds 3] [--reconcile-interval S] [--lease-ttl S]
                             [--resume-steps 10000]

1. kill: two real `manage.py rqworker` processes (see `_workers.py`) with the project's
   settings (lease TTL and reconciler interval from the environment, the defaults unless
   given). A long session runs; the worker whose process holds its lease is SIGKILLed
   (supervisor and worker process at once, as a machine crash would) and the bench waits
   for the next step committed by the other worker. It prints the time from the kill to
   that step, and its parts: the lease still had to run (set by the last heartbeat), then
   the wait for a reconciler pass (due just after the lease runs out), the dispatch,
   claim and load.
   A fresh worker is started after each round so that two are always running.
2. resume: in process, a session of `--resume-steps` steps (written by the real loop), then
   claim + load_tail + the next step (the run_started step) committed, timed, as
   `run_session` starts a run; then the whole history's load_head alone beside the ORM
   path (SQLite's) on the same session, the conversation the run's first model call loads
   (load_history and its messages), and with --profile-load a cProfile of one load_head.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from ._db import fresh_database, setup_django

DB_NAME = "respawn_bench_recovery"


def kill_round(workers, spawn, log: list[dict]) -> None:
    from django.utils import timezone

    from sessions_app.models import AgentSession, Step

    from ._workers import start_session

    sid = start_session(10_000)
    session = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        session = AgentSession.objects.get(id=sid)
        if session.lease_owner and session.last_seq > 300:
            break
        time.sleep(0.01)
    owner_pid = int(session.lease_owner.split(":")[1])
    victim = next(w for w in workers if owner_pid in w.pids())
    victim.kill()
    killed = timezone.now()
    before = AgentSession.objects.get(id=sid)  # as the dead worker left it
    workers.remove(victim)
    owner = before.lease_owner
    lease_left = (before.lease_expires_at - killed).total_seconds()
    deadline = time.monotonic() + 120
    step = None
    while time.monotonic() < deadline:
        step = (
            Step.objects.filter(session_id=sid, kind="system", payload__event="run_started")
            .exclude(payload__worker=owner)
            .order_by("seq")
            .first()
        )
        if step is not None:
            break
        time.sleep(0.01)
    if step is None:
        raise TimeoutError("no other worker took the session over")
    after = AgentSession.objects.get(id=sid)
    recovered = (step.created_at - killed).total_seconds()
    dispatched = (after.dispatched_at - killed).total_seconds()
    log.append(
        {
            "recovered": recovered,
            "lease_left": lease_left,
            "dispatched": dispatched,
            "seq": step.seq,
        }
    )
    print(
        f"  killed {victim.name} at seq {before.last_seq}: lease expired {lease_left:.2f} s "
        f"later, re-dispatched at {dispatched:.2f} s, next step (seq {step.seq}) "
        f"committed at {recovered:.2f} s",
        flush=True,
    )
    # Let it finish quickly: cancel, then wait for the lease to be released.
    from sessions_app.services import core as services

    services.session_cancel(session_id=sid, actor=None)
    workers.append(spawn())


def resume(steps: int, rounds: int, profile_load: bool = False) -> list[float]:
    """Times of claim + load_tail + one committed step on a session of `steps` steps: what
    a worker does before its first step (`run_session`); then, apart, what the run's
    first model call adds (the whole conversation: load_history and the messages)."""
    from agent_runtime.state import NewStep, StepKind
    from sessions_app.models import AgentSession
    from sessions_app.store import session_store
    from sessions_app.store.portable import PortableSessionStore

    from . import _respawn

    sid = _respawn.create_session(_respawn.turns_for(steps))
    result = _respawn.run(sid, 256)
    assert result.outcome == "completed", result
    n = AgentSession.objects.get(id=sid).last_seq
    from django.db import connection

    with connection.cursor() as cursor:  # the statistics autovacuum keeps on a live server
        cursor.execute("ANALYZE sessions_app_step")
    store = session_store()
    times = []
    for i in range(rounds + 1):
        AgentSession.objects.filter(id=sid).update(status="queued", lease_owner=None)
        started = time.perf_counter()
        lease = store.claim(sid, f"resume-{i}", 10)
        head = store.load_tail(sid)
        store.append(
            lease,
            [
                NewStep(
                    kind=StepKind.SYSTEM,
                    payload={
                        "event": "run_started",
                        "worker": lease.owner,
                        "checkpoint_seq": head.checkpoint.seq if head.checkpoint else None,
                        "steps_after_checkpoint": len(head.steps_after_checkpoint),
                    },
                )
            ],
        )
        elapsed = (time.perf_counter() - started) * 1000
        store.release(lease)
        if i:  # the first one warms caches
            times.append(elapsed)
    from agent_runtime.loop import Conversation

    loads, orm_loads, conversations = [], [], []
    orm_store = PortableSessionStore()
    for _ in range(rounds):
        started = time.perf_counter()
        store.load_head(sid)
        loads.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        messages = Conversation("", store.load_history(sid)).messages
        conversations.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        orm_store.load_head(sid)  # the ORM path (SQLite's), for comparison
        orm_loads.append((time.perf_counter() - started) * 1000)
    if profile_load:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.runcall(store.load_head, sid)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(8)
    print(
        f"load_head (the whole history) alone: p50 {statistics.median(loads):.1f} ms "
        f"(the ORM path on the same session: {statistics.median(orm_loads):.1f} ms)",
        flush=True,
    )
    print(
        f"the conversation for the run's first model call (load_history + messages): "
        f"p50 {statistics.median(conversations):.1f} ms ({len(messages):,} messages)",
        flush=True,
    )
    print(
        f"resume of a {n:,}-step session (claim + load_tail + one step committed): "
        f"p50 {statistics.median(times):.1f} ms, min {min(times):.1f}, max {max(times):.1f} "
        f"({rounds} rounds; steps loaded: {len(head.history):,}, from seq {head.history_from:,})",
        flush=True,
    )
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reconcile-interval", type=float, default=None)
    parser.add_argument("--lease-ttl", type=float, default=None)
    parser.add_argument("--resume-steps", type=int, default=10_000)
    parser.add_argument("--resume-rounds", type=int, default=10)
    parser.add_argument("--skip-kill", action="store_true")
    parser.add_argument(
        "--profile-load", action="store_true", help="print a cProfile of one load_head"
    )
    args = parser.parse_args()

    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/11")
    queue = f"bench-recovery-{os.getpid()}"
    extra = {}
    if args.reconcile_interval is not None:
        extra["RESPAWN_RECONCILE_INTERVAL"] = str(args.reconcile_interval)
    if args.lease_ttl is not None:
        extra["RESPAWN_LEASE_TTL"] = str(args.lease_ttl)
    os.environ.update(REDIS_URL=redis_url, RESPAWN_QUEUE=queue, **extra)
    url = fresh_database(DB_NAME)
    setup_django(url)
    from django.conf import settings

    from ._workers import Worker, install_bench_agent, wait_ready, worker_env

    install_bench_agent()
    if not args.skip_kill:
        print(
            f"lease TTL {settings.RESPAWN_LEASE_TTL:g} s, reconciler every "
            f"{settings.RESPAWN_RECONCILE_INTERVAL:g} s (x0.8-1.2)",
            flush=True,
        )
        log_dir = Path(tempfile.mkdtemp(prefix="respawn-bench-"))
        env = worker_env(url, redis_url, queue, **extra)
        count = [0]

        def spawn() -> Worker:
            count[0] += 1
            worker = Worker(env, queue, f"bench-r{count[0]}-{os.getpid()}", log_dir)
            wait_ready([worker], redis_url)
            return worker

        workers = [spawn(), spawn()]
        log: list[dict] = []
        try:
            time.sleep(1.0)
            for _ in range(args.rounds):
                kill_round(workers, spawn, log)
        finally:
            for w in workers:
                w.stop()
            from sessions_app.services.dispatch import queue as get_queue

            get_queue().empty()
        worst = max(r["recovered"] for r in log)
        bound = settings.RESPAWN_LEASE_TTL + 1
        over = [r["recovered"] - r["lease_left"] for r in log]
        print(
            f"kill -> next step by another worker: p50 {statistics.median(r['recovered'] for r in log):.2f} s, "
            f"max {worst:.2f} s (target: under lease TTL + 1 s = {bound:g} s); "
            f"after the lease expired: p50 {statistics.median(over):.2f} s, max {max(over):.2f} s"
        )
        print(f"recovery_max_s: {worst:.2f}")
    times = resume(args.resume_steps, args.resume_rounds, args.profile_load)
    print(f"resume_ms: {statistics.median(times):.1f}")


if __name__ == "__main__":
    main()
