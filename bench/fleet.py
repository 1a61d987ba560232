"""The fleet soak: a scaled-out deployment on one machine, under kills, then the loss figures.

    python -m bench.fleet [--sessions 300] [--workers 4] [--ticks 6] [--seed 11]
                          [--lock-seconds 15]

What runs (every server the bench's own, on loopback; tests/servers.py):
- a PostgreSQL primary (initdb, PostgreSQL's durable defaults) and a streaming replica of it
  (pg_basebackup);
- PgBouncer in transaction mode in front of the primary (a pool of 8 server connections);
  every worker and web process connects through it with RESPAWN_POOLER_SAFE=1;
- Redis: a master, a replica and three Sentinels; every process finds the master through
  REDIS_SENTINELS / REDIS_SENTINEL_MASTER;
- `--workers` `manage.py rqworker` processes and two web processes (gunicorn, one process
  of 4 threads each) reading the dashboard's and the API's pages from the replica
  (DATABASE_REPLICA_URL). One worker in four runs its wall clock two minutes fast, one in
  four two minutes slow (bench/skew); every statement is bounded by a 2 s
  statement_timeout, as a production database bounds them.

Sessions are started over the JSON API, alternately on the two web processes, keeping about
twice as many runnable as there are workers until `--sessions` were started: most of the
demo `slow` agent (`count to --ticks`), one in five of the `demo` agent (a calculation and a
note saved: a side effect with an idempotency key). Meanwhile, one fault every 0.4-1.2 s:
SIGKILL of a busy worker (supervisor and worker process; a new worker is started), SIGKILL
of a busy worker's job process only (its supervisor starts another), SIGKILL of a web
process (started again; no request was in flight on it); once, at a quarter, a busy
worker's job process frozen (SIGSTOP) for twice the lease TTL, as a tool stuck inside
`ctx.fenced()` would hold it, then let go (SIGCONT); once, at three eighths, the job process of a
session of the soak's own `stuck` agent (bench/fleet_agents.py) stopped inside its tool's
`ctx.fenced()`, holding its session row, while another busy worker is SIGKILLed; once,
halfway, SIGKILL of the Redis master (the Sentinels promote its replica); once, at five
eighths, the step table locked against writes for `--lock-seconds` (appends fail as on a
full disk) while fresh sessions run; and once, at three quarters, SIGKILL of PgBouncer,
started again on its port at once (every client connection drops).

Afterwards: every session must be completed, with contiguous steps, the trace of an
uninterrupted run (`slow`), one result per tool call and one side effect per key; the web
processes must serve the final state from the replica. Printed: the faults, steps per
second, recovery times (a worker kill until its session's next committed step; a web kill
until it answers; the Redis failover until the Sentinels name a new master and until a
session started after it commits its first step; the PgBouncer kill until the API answers
and until the next step is committed; the steps other sessions committed while a job
process was frozen; the other session's recovery while a stuck tool held its row; the
takeovers counted as crashes under the step table's lock, which must be none, and the
first step after it) and the PostgreSQL connections used. It
exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

from ._db import ROOT, setup_django

LEASE_TTL = 2.0
STATEMENT_TIMEOUT = "2s"
SKEW = 120  # seconds a skewed worker's clock is off
# One process migrates and makes the operator (one Django start-up less than two commands).
SETUP = """
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django.contrib.auth.models import Group, User
from sessions_app.models import ApiToken
user = User.objects.create_user("fleet", password="fleet-operator")
user.groups.add(Group.objects.get_or_create(name="operator")[0])
print(ApiToken.issue(user)[1])
"""
DEMO_INPUT = "what is (12*7)+3, then save it as a note"


def skewed_clock(offset: int) -> dict[str, str]:
    """The environment that runs a Python process with its wall clock `offset` seconds off
    (bench/skew/sitecustomize.py; its monotonic clock is left true)."""
    path = [str(Path(__file__).parent / "skew"), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in path if p), "RESPAWN_FLEET_SKEW": str(offset)}


class Web:
    """One web process: gunicorn with Respawn's settings, one process of 4 threads."""

    def __init__(self, env: dict[str, str], port: int, log_dir: Path, name: str) -> None:
        self.env, self.port, self.log_path = env, port, log_dir / f"{name}.log"
        self.process: subprocess.Popen | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> float:
        """Start it; seconds until it answers."""
        started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", "config/gunicorn.py", "config.wsgi",
             "-b", f"127.0.0.1:{self.port}", "--workers", "1", "--threads", "4"],
            cwd=ROOT, env=self.env, stdout=open(self.log_path, "ab"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(self.base + "/login/", timeout=2)
                return time.monotonic() - started
            except OSError:
                if self.process.poll() is not None:
                    log = self.log_path.read_text()[-2000:]
                    raise RuntimeError(f"web process exited: {log}") from None
                time.sleep(0.05)
        raise TimeoutError("web process did not come up")

    def kill(self) -> None:
        import psutil

        for process in [*psutil.Process(self.process.pid).children(recursive=True)]:
            process.kill()
        self.process.kill()
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=15)


def api(base: str, token: str, path: str, payload: dict | None = None) -> tuple[dict, str]:
    request = urllib.request.Request(
        base + path,
        data=json.dumps(payload).encode() if payload is not None else None,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read()), response.headers.get("X-Respawn-Reads", "")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=300)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--ticks", type=int, default=6)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--lock-seconds", type=float, default=15.0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    sys.path.insert(0, str(ROOT))
    from tests.servers import PgBouncer, PostgresServer, RedisSentinelSet, free_port

    log_dir = Path(tempfile.mkdtemp(prefix="respawn-fleet-"))
    primary = PostgresServer("fleet-primary", durable=True).init().start()
    servers: list = [primary]
    webs: list[Web] = []
    workers: list = []
    try:
        primary.sql("CREATE DATABASE respawn")
        direct = primary.url("respawn")
        stuck_dir = log_dir / "stuck"
        stuck_dir.mkdir()
        base_env = {
            k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "DATABASE_"))
        }
        setup_env = {**base_env, "DATABASE_URL": direct, "DJANGO_SETTINGS_MODULE":
                     "config.settings", "RESPAWN_PRODUCTION": "0"}  # fmt: skip
        token = subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", SETUP], cwd=ROOT, env=setup_env,
            check=True, capture_output=True, text=True,
        ).stdout.split()[-1]  # fmt: skip
        # Every statement of every process is bounded, as a production deployment bounds
        # them: under the step table's lock below, appends fail rather than wait.
        primary.sql(f"ALTER DATABASE respawn SET statement_timeout = '{STATEMENT_TIMEOUT}'")
        replica = PostgresServer("fleet-replica", durable=True).init_replica_of(primary).start()
        servers.append(replica)
        bouncer = PgBouncer("127.0.0.1", primary.port, pool_size=8)
        bouncer.start()
        servers.append(bouncer)
        redis_set = RedisSentinelSet(master_name="respawn").start()
        servers.append(redis_set)
        env = {
            **base_env,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": bouncer.url("respawn"),
            "RESPAWN_POOLER_SAFE": "1",
            "REDIS_SENTINELS": redis_set.sentinels_setting,
            "REDIS_SENTINEL_MASTER": redis_set.master_name,
            "RESPAWN_QUEUE": "fleet",
            "RESPAWN_PRODUCTION": "0",
            "RESPAWN_LEASE_TTL": str(LEASE_TTL),
            "RESPAWN_RECONCILE_INTERVAL": "1",
            "RESPAWN_DISPATCH_GRACE": "3",
            "RESPAWN_SLOW_DELAY": "0.05",
            # Kills this dense hit one session several times before it writes a step:
            # poison detection (tests/fault) would fail it.
            "RESPAWN_MAX_CRASHES": "1000",
            "PYTHONUNBUFFERED": "1",
            # The demo agents and the soak's own `stuck` one (bench/fleet_agents.py).
            "RESPAWN_AGENTS": "demo_agents:agents,bench.fleet_agents:agents",
            "RESPAWN_FLEET_STUCK_DIR": str(stuck_dir),
        }
        web_env = {**env, "DATABASE_REPLICA_URL": replica.url("respawn"), "RESPAWN_DB_POOL": "1"}
        os.environ.update({k: v for k, v in env.items() if k.startswith(("REDIS_", "RESPAWN_"))})
        setup_django(direct)  # the bench's own reads: the primary, directly
        from .pooler import ConnectionSampler

        sampler = ConnectionSampler(primary.url("postgres"), "respawn")
        sampler.start()
        report = run(
            args, rng, env, web_env, token, webs, workers, log_dir, redis_set, bouncer,
            free_port, direct, stuck_dir,
        )  # fmt: skip
        report["peak_connections"] = sampler.stop()
        report["replica_reads"] = check_replica_reads(webs, token, report["ids"], replica, primary)
        print_report(args, report, bouncer)
    finally:
        for web in webs:
            web.stop()
        for worker in workers:
            worker.stop()
        for server in reversed(servers):
            server.stop()
        print(f"\nlogs: {log_dir}")


def run(
    args, rng, env, web_env, token, webs, workers, log_dir, redis_set, bouncer, free_port,
    direct, stuck_dir,
) -> dict:  # fmt: skip
    from django.db.models import Max

    from sessions_app.models import AgentSession, Status, Step

    from ._workers import Worker

    def start_worker():
        # Respawn's own worker and the demo agents, not the bench agent of _workers. One
        # worker in four runs its clock SKEW ahead, one SKEW behind.
        skew = {0: SKEW, 1: -SKEW}.get(len(workers) % 4)
        worker = Worker(
            {**env, **skewed_clock(skew)} if skew else env,
            "fleet",
            f"fleet-w{len(workers)}",
            log_dir,
            "sessions_app.workers.worker.RespawnWorker",
        )
        workers.append(worker)
        return worker

    for _ in range(args.workers):
        start_worker()
    for i in range(2):
        web = Web(web_env, free_port(), log_dir, f"web{i}")
        web.start()
        webs.append(web)
    wait_registered(workers)

    ids: list[str] = []
    slow_ids: set[str] = set()
    faults: Counter[str] = Counter()
    worker_recoveries: list[float] = []
    web_restarts: list[float] = []
    pending: list[tuple[str, int, float]] = []
    failover: dict[str, float] = {}
    pooler: dict[str, float] = {}
    frozen: dict[str, float] = {}
    stuck: dict[str, float] = {}
    locked: dict[str, float] = {}
    runnable_statuses = [Status.QUEUED, Status.RUNNING]
    started = time.monotonic()
    next_fault = started + 2.0
    turn = 0

    def start_slow() -> str:
        """A `slow` session started over the API (checked against the uninterrupted run)."""
        session, _ = api(webs[len(ids) % 2].base, token, "/api/sessions",
                         {"agent": "slow", "input": f"count to {args.ticks}"})  # fmt: skip
        ids.append(session["id"])
        slow_ids.add(session["id"])
        return session["id"]

    def alive_workers():
        return [w for w in workers if w.process.poll() is None]

    def busy():
        owners = AgentSession.objects.filter(status=Status.RUNNING).exclude(lease_owner=None)
        held = {}
        for sid, owner, seq in owners.values_list("id", "lease_owner", "last_seq"):
            held[int(owner.split(":")[1])] = (str(sid), seq)
        return [(w, held[pid]) for w in alive_workers() for pid in w.pids() if pid in held]

    def last_seq(sid):
        return AgentSession.objects.filter(id=sid).values_list("last_seq", flat=True).first()

    while True:
        runnable = AgentSession.objects.filter(id__in=ids, status__in=runnable_statuses).count()
        while runnable < 2 * args.workers and len(ids) < args.sessions:
            slow = rng.random() < 0.8
            payload = (
                {"agent": "slow", "input": f"count to {args.ticks}"}
                if slow
                else {"agent": "demo", "input": DEMO_INPUT}
            )
            web = webs[turn % 2]
            turn += 1
            session, _ = api(web.base, token, "/api/sessions", payload)
            ids.append(session["id"])
            if slow:
                slow_ids.add(session["id"])
            runnable += 1
        for sid, seq, at in list(pending):
            if (last_seq(sid) or 0) > seq:
                worker_recoveries.append(time.monotonic() - at)
                pending.remove((sid, seq, at))
        if not runnable and len(ids) >= args.sessions:
            break
        now = time.monotonic()
        if now < next_fault:
            time.sleep(0.05)
            continue
        next_fault = now + rng.uniform(0.4, 1.2)
        if not frozen and len(ids) >= args.sessions // 4 and (candidates := busy()):
            worker, (sid, _) = rng.choice(candidates)
            job_pids = worker.pids()[1:]
            if job_pids:
                faults["job process frozen (SIGSTOP, 2 lease TTLs)"] += 1
                others = Step.objects.exclude(session_id=sid)
                before = others.count()
                for pid in job_pids:
                    os.kill(pid, signal.SIGSTOP)
                pending.append((sid, last_seq(sid) or 0, time.monotonic()))
                time.sleep(2 * LEASE_TTL)
                frozen["others_steps"] = others.count() - before
                frozen["seconds"] = 2 * LEASE_TTL
                for pid in job_pids:
                    os.kill(pid, signal.SIGCONT)
                continue
        if not stuck and len(ids) >= 3 * args.sessions // 8:
            stuck.update(stuck_tool(webs[0], token, ids, stuck_dir, busy, start_worker))
            faults["job process stopped inside ctx.fenced()"] += 1
            faults["worker SIGKILL (supervisor too)"] += 1
            continue
        if not locked and failover and len(ids) >= 5 * args.sessions // 8:
            locked.update(lock_steps(direct, args.lock_seconds, start_slow, 2 * args.workers))
            faults[f"step table locked {args.lock_seconds:g} s"] += 1
            continue
        if not pooler and failover and len(ids) >= 3 * args.sessions // 4:
            last_step = Step.objects.aggregate(last=Max("id"))["last"] or 0
            killed_at = time.monotonic()
            bouncer.kill()
            bouncer.start()
            pooler["listening"] = time.monotonic() - killed_at
            while True:
                try:
                    api(webs[0].base, token, "/api/sessions?limit=1")
                    break
                except OSError as exc:  # a 503 while connections are made again
                    if time.monotonic() - killed_at > 60:
                        raise SystemExit(
                            f"no API answer 60 s after PgBouncer's kill: {exc}"
                        ) from exc
                    time.sleep(0.02)
            pooler["api"] = time.monotonic() - killed_at
            while not Step.objects.filter(id__gt=last_step).exists():
                if time.monotonic() - killed_at > 60:
                    raise SystemExit("no step committed within 60 s of PgBouncer's kill")
                time.sleep(0.02)
            pooler["first_step"] = time.monotonic() - killed_at
            faults["PgBouncer SIGKILL (started again)"] += 1
            continue
        if not failover and len(ids) >= args.sessions // 2:
            killed_at = time.monotonic()
            redis_set.kill_master()
            failover["promoted"] = time.monotonic() - killed_at
            probe, _ = api(webs[0].base, token, "/api/sessions", {"agent": "slow",
                           "input": "count to 1"})  # fmt: skip
            ids.append(probe["id"])
            while not Step.objects.filter(session_id=probe["id"], seq__gt=1).exists():
                time.sleep(0.02)
            failover["first_step"] = time.monotonic() - killed_at
            faults["redis master SIGKILL (failover)"] += 1
            continue
        kind = rng.choices(["worker", "job process", "web"], [50, 30, 20])[0]
        if kind == "web":
            web = rng.choice(webs)
            web.kill()
            web_restarts.append(web.start())
            faults["web process SIGKILL"] += 1
            continue
        candidates = busy()
        if not candidates:
            continue
        worker, (sid, _) = rng.choice(candidates)
        pids = worker.pids()
        if kind == "job process":
            for pid in pids[1:]:
                os.kill(pid, signal.SIGKILL)
            faults["job process SIGKILL"] += 1
        else:
            worker.kill()
            start_worker()
            faults["worker SIGKILL (supervisor too)"] += 1
        # From the kill on: a step committed later comes from a run after it.
        pending.append((sid, last_seq(sid) or 0, time.monotonic()))

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        for sid, seq, at in list(pending):
            if (last_seq(sid) or 0) > seq:
                worker_recoveries.append(time.monotonic() - at)
                pending.remove((sid, seq, at))
        if not AgentSession.objects.filter(id__in=ids, status__in=runnable_statuses).exists():
            break
        time.sleep(0.2)
    steps = Step.objects.filter(session_id__in=ids)
    span = time.monotonic() - started
    last = steps.aggregate(last=Max("created_at"))["last"]
    return {
        "ids": ids,
        "slow_ids": slow_ids,
        "faults": faults,
        "worker_recoveries": worker_recoveries,
        "pending": len(pending),
        "web_restarts": web_restarts,
        "failover": failover,
        "pooler": pooler,
        "frozen": frozen,
        "stuck": stuck,
        "locked": locked,
        "skewed": sum(1 for i in range(len(workers)) if i % 4 < 2),
        "workers_started": len(workers),
        "wall": span,
        "steps": steps.count(),
        "last_step": last,
        "checks": check(ids, slow_ids, args.ticks),
    }


def stuck_tool(web, token, ids, stuck_dir: Path, busy, start_worker) -> dict[str, float]:
    """A `stuck` session's job process stopped (SIGSTOP) inside its tool's `ctx.fenced()`,
    where it holds its session row's lock; meanwhile another busy worker is SIGKILLed. The
    time until that other session's next step: the stuck row must delay no one else."""
    from sessions_app.models import AgentSession

    session, _ = api(web.base, token, "/api/sessions", {"agent": "stuck", "input": "count to 3"})
    ids.append(session["id"])
    deadline = time.monotonic() + 60
    while not (marks := list(stuck_dir.iterdir())):
        if time.monotonic() > deadline:
            raise SystemExit("the stuck session's tool did not start within 60 s")
        time.sleep(0.02)
    pid = int(marks[0].name)
    os.kill(pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        # A long session to kill under: on a worker other than the stopped one (one more
        # worker is started when every other is busy or there is none).
        victim, _ = api(web.base, token, "/api/sessions", {"agent": "slow",
                        "input": "count to 200"})  # fmt: skip
        ids.append(victim["id"])
        extra = False
        while not (others := [(w, h) for w, h in busy() if h[0] == victim["id"]]):
            if not extra and time.monotonic() - stopped_at > 5:
                start_worker()
                extra = True
            if time.monotonic() - stopped_at > 60:
                raise SystemExit("a session started beside the stuck tool did not run in 60 s")
            time.sleep(0.05)
        worker, (sid, _) = others[0]
        killed_at = time.monotonic()
        worker.kill()
        seq = AgentSession.objects.get(id=sid).last_seq  # its last commit is in or not now
        start_worker()
        while AgentSession.objects.get(id=sid).last_seq <= seq:
            if time.monotonic() - killed_at > 60:
                raise SystemExit("a killed worker's session waited 60 s behind a stuck tool")
            time.sleep(0.02)
        recovered = time.monotonic() - killed_at
        time.sleep(max(0.0, 3 * LEASE_TTL - (time.monotonic() - stopped_at)))
    finally:
        os.kill(pid, signal.SIGCONT)
    return {"held": time.monotonic() - stopped_at, "other_recovery": recovered}


def lock_steps(direct: str, seconds: float, start_slow, sessions: int) -> dict[str, float]:
    """The step table locked against writes (LOCK TABLE ... IN SHARE MODE, as a long
    migration or a full tablespace stops appends) for `seconds`, every statement bounded by
    STATEMENT_TIMEOUT: appends fail for as long. Measured: the takeovers counted as crashes
    meanwhile (must be none: no worker died), and the time from the lock's release to the
    next committed step. `sessions` new ones are started and running when the lock is taken
    (`start_slow` starts one)."""
    import psycopg
    from django.db.models import Max

    from sessions_app.models import AgentSession, Status, Step

    def crash_counts() -> dict:
        live = AgentSession.objects.filter(status__in=[Status.QUEUED, Status.RUNNING])
        return dict(live.values_list("id", "crash_count"))

    time.sleep(3 * LEASE_TTL)  # the takeovers of the kills just before are over
    started = [start_slow() for _ in range(sessions)]
    deadline = time.monotonic() + 60
    while Step.objects.filter(session_id__in=started, seq=2).count() < len(started):
        if time.monotonic() > deadline:
            raise SystemExit("sessions started before the lock did not run within 60 s")
        time.sleep(0.02)
    before = crash_counts()
    counted: set = set()
    with psycopg.connect(direct) as holder:
        holder.execute("SET statement_timeout = 0")
        # Taken once the appends in flight have committed; every step after is later.
        holder.execute(f"LOCK TABLE {Step._meta.db_table} IN SHARE MODE")
        last_step = Step.objects.aggregate(last=Max("id"))["last"] or 0
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            now = crash_counts()
            counted |= {sid for sid, n in now.items() if n > before.get(sid, 0)}
            time.sleep(0.2)
        during = Step.objects.filter(id__gt=last_step).count()
        holder.rollback()
    released_at = time.monotonic()
    while not Step.objects.filter(id__gt=last_step).exists():
        if time.monotonic() - released_at > 60:
            with psycopg.connect(direct) as look:
                for row in look.execute(
                    "SELECT pid, state, wait_event_type, wait_event, xact_start, left(query, 120)"
                    " FROM pg_stat_activity WHERE datname = 'respawn'"
                ):
                    print(*row)
            raise SystemExit("no step committed within 60 s of the lock's release")
        time.sleep(0.02)
    first_step = time.monotonic() - released_at
    while time.monotonic() - released_at < 2 * LEASE_TTL:
        now = crash_counts()
        counted |= {sid for sid, n in now.items() if n > before.get(sid, 0)}
        time.sleep(0.2)
    return {"steps_during": during, "first_step": first_step, "crashes_counted": len(counted)}


def wait_registered(workers, timeout: float = 60) -> None:
    """Until every worker has registered with Redis (found through the Sentinels)."""
    from rq import Worker as RQWorker

    from sessions_app.services.dispatch import redis_connection

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        names = {w.name for w in RQWorker.all(connection=redis_connection())}
        if {w.name for w in workers} <= names:
            return
        time.sleep(0.1)
    raise TimeoutError("workers did not start")


def check(ids: list[str], slow_ids: set[str], ticks: int) -> Counter:
    """Losses and doubles, as tests/fault/conftest.assert_invariants defines them."""
    from django.db.models import Count

    from agent_runtime.loop import RunConfig, run_session
    from agent_runtime.store import InMemoryEffects, InMemoryStore
    from demo_agents import demo_agents
    from sessions_app.models import AgentSession, SideEffect, Status, Step

    store = InMemoryStore()
    store.create_session("ref", "slow", f"count to {ticks}")
    run_session("ref", store=store, agents=demo_agents(slow_delay=0), effects=InMemoryEffects(),
                config=RunConfig(worker_id="ref"))  # fmt: skip
    reference = [(str(s.kind), s.payload) for s in store.session("ref").steps if s.kind != "system"]
    out: Counter = Counter()
    for sid in ids:
        session = AgentSession.objects.get(id=sid)
        steps = list(Step.objects.filter(session_id=sid).order_by("seq"))
        out["steps"] += len(steps)
        if session.status != Status.COMPLETED:
            out["sessions not completed"] += 1
        if [s.seq for s in steps] != list(range(1, len(steps) + 1)):
            out["sessions with a gap or a doubled seq"] += 1
        live = [s for s in steps if s.superseded_at is None]
        results = Counter(s.payload["call_id"] for s in live if s.kind == "tool_result")
        calls = {s.payload["call_id"] for s in live if s.kind == "tool_call"}
        out["tool results doubled"] += sum(n - 1 for n in results.values() if n > 1)
        out["tool calls without their result"] += len(calls - set(results))
        if sid in slow_ids and session.status == Status.COMPLETED:
            convo = [(s.kind, s.payload) for s in steps if s.kind != "system"]
            if convo != reference:
                out["slow sessions whose trace differs from an uninterrupted run"] += 1
        effects = SideEffect.objects.filter(session_id=sid)
        out["side effects doubled"] += (
            effects.values("key").annotate(n=Count("id")).filter(n__gt=1).count()
        )
        if sid not in slow_ids and session.status == Status.COMPLETED and not effects.exists():
            out["demo sessions whose note is missing"] += 1
    return out


def check_replica_reads(webs, token, ids, replica, primary) -> dict:
    """After the replica has replayed everything: the web processes serve the final state
    of a sample of sessions from it."""
    target = primary.sql("SELECT pg_current_wal_lsn()::text")[0][0]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if replica.sql(f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn")[0][0]:
            break
        time.sleep(0.1)
    served = Counter()
    for i, sid in enumerate(ids[:: max(1, len(ids) // 40)]):
        session, reads = api(webs[i % 2].base, token, f"/api/sessions/{sid}")
        served[(reads, session["status"])] += 1
    return served


def print_report(args, report: dict, bouncer) -> None:
    checks, faults = report["checks"], report["faults"]
    print(
        f"\nfleet soak: {len(report['ids'])} sessions on {args.workers} workers and 2 web "
        f"processes, PgBouncer (transaction mode, pool 8), a streaming replica, Redis with "
        f"Sentinel; {os.cpu_count()} CPUs; lease TTL {LEASE_TTL:g}s; {report['wall']:.0f}s"
    )
    print(f"\n{'fault':44} {'count':>6}")
    for kind, n in sorted(faults.items()):
        print(f"{kind:44} {n:6d}")
    print(f"{'faults in all':44} {sum(faults.values()):6d}")
    print(f"\n{'durable steps':44} {checks['steps']:6d}")
    print(
        f"{'steps per second (wall, faults included)':44} {checks['steps'] / report['wall']:6.0f}"
    )
    problems = [k for k in checks if k != "steps"]
    for key in (
        "sessions not completed",
        "sessions with a gap or a doubled seq",
        "tool results doubled",
        "tool calls without their result",
        "slow sessions whose trace differs from an uninterrupted run",
        "side effects doubled",
        "demo sessions whose note is missing",
    ):
        print(f"{key:60} {checks[key]:6d}")
    rec = sorted(report["worker_recoveries"])
    if rec:
        print(
            f"\nworker kill -> the session's next step: median {statistics.median(rec):.2f}s, "
            f"p90 {rec[int(0.9 * (len(rec) - 1))]:.2f}s, max {rec[-1]:.2f}s ({len(rec)} kills; "
            f"{report['pending']} not measured)"
        )
    if report["web_restarts"]:
        print(
            f"web kill -> answering again: median {statistics.median(report['web_restarts']):.2f}s"
            f", max {max(report['web_restarts']):.2f}s"
        )
    if report["failover"]:
        f = report["failover"]
        print(
            f"Redis master kill -> Sentinels name the new master: {f['promoted']:.2f}s; -> a "
            f"session started after it commits its first step: {f['first_step']:.2f}s"
        )
    if report["pooler"]:
        p = report["pooler"]
        print(
            f"PgBouncer kill -> listening again: {p['listening']:.2f}s; -> the API answers: "
            f"{p['api']:.2f}s; -> a step is committed: {p['first_step']:.2f}s"
        )
    if report["frozen"]:
        f = report["frozen"]
        print(
            f"a job process frozen {f['seconds']:g}s: other sessions committed "
            f"{f['others_steps']} steps meanwhile"
        )
    if report["stuck"]:
        s = report["stuck"]
        print(
            f"a job process stopped {s['held']:.1f}s inside ctx.fenced() (its session row "
            f"locked): another worker's kill -> its session's next step {s['other_recovery']:.2f}s"
        )
    if report["locked"]:
        lk = report["locked"]
        print(
            f"step table locked {args.lock_seconds:g}s (statements time out after "
            f"{STATEMENT_TIMEOUT}): {lk['steps_during']} steps meanwhile; release -> a step is "
            f"committed: {lk['first_step']:.2f}s; takeovers counted as crashes: "
            f"{lk['crashes_counted']}"
        )
    print(
        f"workers whose clock runs {SKEW}s fast or slow: {report['skewed']} of "
        f"{report['workers_started']} started"
    )
    print(f"PostgreSQL client connections at most (behind PgBouncer): {report['peak_connections']}")
    print(f"dashboard reads after the run (where from, status): {dict(report['replica_reads'])}")
    if report["locked"].get("crashes_counted"):
        problems.append("takeovers counted as crashes under the lock")
        checks["takeovers counted as crashes under the lock"] = report["locked"]["crashes_counted"]
    if any(checks[k] for k in problems):
        raise SystemExit("PROBLEMS ABOVE")  # a failed check fails the run, not only its text
    print("nothing lost or doubled")


if __name__ == "__main__":
    main()
