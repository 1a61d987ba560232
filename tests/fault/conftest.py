"""Fault-injection helpers: a private Redis and a private PostgreSQL the tests may kill, a
fleet of real workers, the faults (freeze, SIGKILL at random) and the checks after them."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
import redis
from rq import Worker
from rq.worker import WorkerStatus

from agent_runtime.loop import RunConfig, run_session
from agent_runtime.store import InMemoryEffects, InMemoryStore
from demo_agents import demo_agents
from sessions_app.models import RUNNABLE, AgentSession, Status, Step

from ..conftest import (
    WorkerProcess,
    assert_invariants,
    database_url,
    live_conversation,
    wait_for,
    without_ids,
)
from ..servers import ROOT, PostgresServer, RedisServer, ServerError, free_port, wait_port
from ..stubs.llm_servers import openai_server  # noqa: F401 (the OpenAI-protocol stub, for workers too)


@pytest.fixture
def private_redis(tmp_path, settings):
    server = RedisServer(tmp_path).start()
    queue = settings.RESPAWN_QUEUE
    settings.REDIS_URL = server.url
    settings.RQ_QUEUES = {**settings.RQ_QUEUES, queue: {"URL": server.url, "DEFAULT_TIMEOUT": 3600}}
    yield server
    server.stop()


@pytest.fixture
def fleet(start_worker, private_redis):
    """Start workers on the private Redis; `fleet.start()` returns a WorkerProcess."""

    class Fleet:
        def __init__(self) -> None:
            self.workers: list[WorkerProcess] = []

        def start(self, **env: str):
            # The private Redis itself, even in a run through Sentinel (--through-sentinel).
            worker = start_worker(REDIS_URL=private_redis.url, REDIS_SENTINELS="", **env)
            self.workers.append(worker)
            return worker

        def alive(self):
            return [w for w in self.workers if w.process.poll() is None]

        def busy(self):
            """Live workers running a job now, by RQ's own record of each worker's state."""
            conn = redis.Redis.from_url(private_redis.url)
            prefix = Worker.redis_worker_namespace_prefix
            return [
                w
                for w in self.alive()
                if conn.hget(f"{prefix}{w.name}", "state") == WorkerStatus.BUSY.value.encode()
            ]

        def running(self, session) -> object | None:
            """The worker whose process holds the session's lease (owner = host:pid:…)."""
            session.refresh_from_db()
            if not session.lease_owner:
                return None
            pid = int(session.lease_owner.split(":")[1])
            for worker in self.alive():
                if pid in worker.pids():
                    return worker
            return None

    return Fleet()


def kill_worker_process_only(worker) -> bool:
    """SIGKILL the process that runs the jobs and leave its supervisor alive, as the OOM
    killer would."""
    children = psutil.Process(worker.process.pid).children(recursive=True)
    for child in children:
        os.kill(child.pid, signal.SIGKILL)
    return bool(children)


def worker_running_a_session(workers, sessions, *, timeout: float = 30.0):
    """Wait for one of `workers` whose forked process holds the lease of one of `sessions`
    (lease_owner = host:pid:…), and return it: a worker that is mid-run, not one still
    starting up or idle between jobs."""

    def holder():
        for session in AgentSession.objects.filter(
            pk__in=[s.pk for s in sessions], lease_owner__gt=""
        ):
            pid = int(session.lease_owner.split(":")[1])
            for worker in workers:
                if worker.process.poll() is None and pid in worker.pids()[1:]:
                    return worker
        return None

    return wait_for(holder, timeout=timeout, what="a worker holding a session's lease")


@contextmanager
def frozen(worker) -> Iterator[None]:
    """The worker's supervisor and job process SIGSTOPped (a GC pause, a VM frozen) for the
    block, and SIGCONTed after it, whatever happens in it."""
    pids = worker.pids()
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def kill_busy_workers_at_random(
    fleet,
    sessions,
    *,
    rng: random.Random,
    kills: int,
    within: float,
    pause: tuple[float, float],
    **env: str,
) -> int:
    """SIGKILL a worker that is running a job, after a random pause (seconds, between the
    two of `pause`), and start a new one with `env`, until `kills` kills landed, `within`
    seconds passed or no session is left to run. Returns the kills that landed."""
    landed, started = 0, time.monotonic()
    while landed < kills and time.monotonic() - started < within:
        time.sleep(rng.uniform(*pause))
        busy = fleet.busy()
        if not busy:
            ids = [s.id for s in sessions]
            if not AgentSession.objects.filter(id__in=ids, status__in=RUNNABLE).exists():
                break
            continue
        rng.choice(busy).kill()
        landed += 1
        fleet.start(**env)
    return landed


def wait_for_tool_results(sessions, count: int, *, timeout: float = 20.0, **kwargs) -> None:
    """Until the sessions have `count` tool results between them (the runs are going)."""
    kwargs.setdefault("what", "the runs to get going")
    wait_for(
        lambda: Step.objects.filter(session__in=sessions, kind="tool_result").count() >= count,
        timeout=timeout,
        **kwargs,
    )


def reference(agent: str, text: str) -> list[tuple[str, dict]]:
    """The trace of an uninterrupted run, computed by the engine on the in-memory store."""
    store = InMemoryStore()
    store.create_session("ref", agent, text)
    run_session(
        "ref",
        store=store,
        agents=demo_agents(slow_delay=0),
        effects=InMemoryEffects(),
        config=RunConfig(worker_id="ref"),
    )
    out = []
    for step in store.session("ref").steps:
        if step.kind != "system":
            out.append((str(step.kind), step.payload))
    return [(k, without_ids(p, "ref")) for k, p in out]


def runs_of(session) -> int:
    return Step.objects.filter(session=session, kind="system", payload__event="run_started").count()


def assert_completed(session, trace: list[tuple[str, dict]] | None = None) -> None:
    """The session completed (refreshed from PostgreSQL), with `trace` as its live
    conversation when one is given, and the invariants hold."""
    session.refresh_from_db()
    assert session.status == Status.COMPLETED, (session.id, session.status, session.last_error)
    if trace is not None:
        assert live_conversation(session) == trace
    assert_invariants(session)


conversation = live_conversation


@contextmanager
def web_server(env: dict[str, str], log_path) -> Iterator[str]:
    """A real web process (`runserver` with the production connection pool, which the
    tests' own settings switch off) on a port of its own, until it answers; yields its
    base URL. Its log is shown when the block fails."""
    port = free_port()
    env = {**env, "RESPAWN_DB_POOL": "1", "DJANGO_SETTINGS_MODULE": "config.settings_test"}
    with open(log_path, "wb") as log:  # the server keeps its own descriptor
        server = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        wait_port(port, server)
        yield f"http://127.0.0.1:{port}"
    except BaseException:
        print("--- web server log ---\n" + Path(log_path).read_text(errors="replace"))
        raise
    finally:
        server.terminate()
        server.wait(timeout=10)


def http_get(url: str, **headers: str) -> tuple[int, dict[str, str], bytes, float]:
    """(status, headers, body, seconds taken) of a GET; an HTTP error is an answer too."""
    started = time.monotonic()
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, answered, body = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        status, answered, body = exc.code, dict(exc.headers), exc.read()
    return status, answered, body, time.monotonic() - started


@pytest.fixture(scope="module")
def private_postgres(django_db_setup, django_db_blocker):
    """A PostgreSQL server of this module's tests, with a copy of the test database."""
    try:
        server = PostgresServer("private", max_connections=30)
    except ServerError as exc:  # PostgreSQL's server programs are not installed
        pytest.skip(str(exc))
    try:
        with django_db_blocker.unblock():
            source = database_url()
        server.init().start().copy_database(source, "respawn_private")
    except BaseException:
        server.stop()
        raise
    yield server
    server.stop()


# Tables a test on the private server starts without rows in (what the flush between
# transactional tests does on the shared one); the schema's own data stays.
_KEPT_TABLES = {
    "django_migrations",
    "django_content_type",
    "auth_permission",
    "auth_group",
    "auth_group_permissions",
}


@pytest.fixture
def private_db(private_postgres, transactional_db):
    """Point this test process's database connection at the private server (the workers
    a test starts get its URL): the test may restart, stop and starve it."""
    from django.db import connections

    connection = connections["default"]
    saved = {key: connection.settings_dict.get(key) for key in ("HOST", "PORT", "NAME")}
    connection.close()
    if not private_postgres.is_ready():
        private_postgres.start()
    connection.settings_dict.update(
        HOST="127.0.0.1", PORT=str(private_postgres.port), NAME=private_postgres.database
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        tables = [t for (t,) in cursor.fetchall() if t not in _KEPT_TABLES]
        cursor.execute(
            "TRUNCATE " + ", ".join(f'"{t}"' for t in tables) + " RESTART IDENTITY CASCADE"
        )
    try:
        yield private_postgres
    finally:
        connection.close()
        connection.settings_dict.update(saved)


def figures(test: str, **measured: float | int) -> None:
    """Print what a fault test measured (shown with `pytest -s`); docs/RELIABILITY.md
    quotes these."""
    shown = ", ".join(
        f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in measured.items()
    )
    print(f"\n[fault figures] {test}: {shown}")


def first_step_after(sessions, moment: float) -> float | None:
    """Seconds from `moment` (time.time()) to the first step any of the sessions committed
    after it; None when none did."""
    from datetime import UTC, datetime

    after = (
        Step.objects.filter(
            session__in=sessions, created_at__gt=datetime.fromtimestamp(moment, UTC)
        )
        .order_by("created_at")
        .values_list("created_at", flat=True)
        .first()
    )
    return None if after is None else after.timestamp() - moment
