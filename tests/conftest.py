from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.db import connection

from .servers import WorkerProcess

ROOT = Path(__file__).resolve().parent.parent
# Packages of agents that are not Respawn's (a team's own, and mistakes teams make): the
# tests import them as a deployment would, from a path of their own.
PACKAGES = ROOT / "tests" / "packages"
sys.path.insert(0, str(PACKAGES))


def pytest_addoption(parser):
    parser.addoption(
        "--through-pgbouncer",
        action="store_true",
        help="run the tests and their worker processes through a PgBouncer in transaction "
        "mode that the run starts (with RESPAWN_POOLER_SAFE on), in front of DATABASE_URL",
    )

    parser.addoption(
        "--through-sentinel",
        action="store_true",
        help="run the tests and their worker processes against Redis through Sentinel: a "
        "master, a replica and three Sentinels that the run starts (REDIS_SENTINELS)",
    )


@pytest.fixture(scope="session", autouse=True)
def _redis_through_sentinel(request):
    """With --through-sentinel: every queue of the run, in the test process and in the
    worker processes it starts, reaches Redis by asking Sentinels for the master, as
    REDIS_SENTINELS and REDIS_SENTINEL_MASTER configure it."""
    if not request.config.getoption("--through-sentinel"):
        yield None
        return
    from tests.servers import RedisSentinelSet

    servers = RedisSentinelSet(master_name="respawn").start()
    before = settings.RQ_QUEUES
    settings.RQ_QUEUES = servers.rq_queues(before)
    os.environ.update(servers.environment)
    yield servers
    settings.RQ_QUEUES = before
    for name in servers.environment:
        os.environ.pop(name)
    servers.stop()


@pytest.fixture(scope="session")
def pgbouncer(request):
    """The run's PgBouncer (transaction mode) with --through-pgbouncer, else None."""
    return getattr(request.config, "_respawn_pgbouncer", None)


@pytest.fixture(scope="session")
def django_db_modify_db_settings(request, django_db_modify_db_settings_parallel_suffix):
    """With --through-pgbouncer: start PgBouncer in transaction mode in front of the
    configured server and point the test database (and so every worker process the tests
    start) at it, in pooler-safe mode, before the test database is created."""
    if not request.config.getoption("--through-pgbouncer"):
        return
    from tests.servers import PgBouncer

    db = settings.DATABASES["default"]
    if db["ENGINE"] != "django.db.backends.postgresql":
        pytest.exit("--through-pgbouncer needs DATABASE_URL to name a PostgreSQL server")
    bouncer = PgBouncer(db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432))
    bouncer.start()
    request.config._respawn_pgbouncer = bouncer
    request.addfinalizer(bouncer.stop)
    db["HOST"], db["PORT"] = "127.0.0.1", bouncer.port
    db.setdefault("OPTIONS", {})["prepare_threshold"] = None
    db["DISABLE_SERVER_SIDE_CURSORS"] = True
    settings.RESPAWN_POOLER_SAFE = True
    os.environ["RESPAWN_POOLER_SAFE"] = "1"  # the worker processes' environment


def wait_for(
    condition: Callable[[], object],
    *,
    timeout: float = 20.0,
    interval: float = 0.05,
    what: str = "condition",
):
    """Poll until condition() is truthy; return its value or fail the test."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def wait_final(sessions, timeout: float = 60.0) -> None:
    """Until none of the sessions is runnable any more: each completed, failed, cancelled,
    waiting for a person or paused."""
    from sessions_app.models import RUNNABLE, AgentSession

    ids = [s.id for s in sessions]
    wait_for(
        lambda: not AgentSession.objects.filter(id__in=ids, status__in=RUNNABLE).exists(),
        timeout=timeout,
        interval=0.2,
        what=f"{len(ids)} session(s) to reach a final status",
    )


def wait_stopped(session, timeout: float = 30.0):
    """wait_final for one session; returns it refreshed."""
    wait_final([session], timeout=timeout)
    session.refresh_from_db()
    return session


def wait_for_status(session, status: str, timeout: float = 60.0):
    """Until the session is in `status`; returns it refreshed. Fails at once when it stops
    in another status (with its last error), instead of waiting out the timeout."""
    from sessions_app.models import RUNNABLE

    def reached() -> bool:
        session.refresh_from_db()
        if session.status != status and session.status not in RUNNABLE:
            pytest.fail(f"session {session.id} is {session.status}: {session.last_error}")
        return session.status == status

    wait_for(reached, timeout=timeout, what=f"session {session.id} to be {status}")
    return session


@pytest.fixture(autouse=True)
def _fresh_cache():
    """Each test starts with an empty cache: the dashboard caches counts for seconds."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture(autouse=True)
def _no_heartbeat_inside_a_test_transaction(request):
    """A test inside one transaction (django_db without transaction=True) that runs a
    session in process: the run's heartbeat thread reads the session on a connection of its
    own, which cannot see the lease the uncommitted claim took, and would stop the run as
    fenced off once a beat is due (a third of the lease TTL, 0.67 s in the tests) on a busy
    machine. The lease TTL is long there; tests of expiry use committed data."""
    marker = request.node.get_closest_marker("django_db")
    if marker is None or marker.kwargs.get("transaction") or (marker.args and marker.args[0]):
        yield
        return
    settings = request.getfixturevalue("settings")
    settings.RESPAWN_LEASE_TTL = 60
    yield


@pytest.fixture(autouse=True)
def _tools_share_the_test_transaction(request, monkeypatch):
    """A test that runs inside a transaction (django_db without transaction=True) sees its
    rows on its own connection only, while tools run on threads of their own (for their
    timeout), each with its own connection: a tool's fenced write (ctx.fenced) would not
    find the session it belongs to. In such tests tools run on the test's thread, inside
    its transaction, as they would see committed rows in production."""
    marker = request.node.get_closest_marker("django_db")
    uses_db = marker is not None or "db" in request.fixturenames
    transactional = (
        "transactional_db" in request.fixturenames
        or "live_server" in request.fixturenames
        or (marker is not None and (marker.kwargs.get("transaction") or marker.args[:1] == (True,)))
    )
    if uses_db and not transactional:
        import agent_runtime.tools

        monkeypatch.setattr(
            agent_runtime.tools,
            "_call_with_timeout",
            lambda function, args, timeout: function(**args),
        )


@pytest.fixture(autouse=True)
def _role_groups_as_migrated(request):
    """The role groups every migrated database has (migrations 0002 and 0021). The flush
    after a transactional test empties every table, these rows too, so whichever test
    comes next in that process would find them gone; which one that is depends on how the
    suite is dealt to its processes. Each database test starts with them, as after migrate."""
    uses_db = request.node.get_closest_marker("django_db") is not None or any(
        name in request.fixturenames for name in ("db", "transactional_db", "live_server")
    )
    if uses_db:
        request.getfixturevalue("_django_db_helper")
        from sessions_app.permissions import ADMIN_GROUP, OPERATOR_GROUP, VIEWER_GROUP

        for name in (VIEWER_GROUP, OPERATOR_GROUP, ADMIN_GROUP):
            Group.objects.get_or_create(name=name)
    yield


@pytest.fixture
def users(db):
    """The trio every view test needs: an operator, a viewer and an outsider."""
    operator_group, _ = Group.objects.get_or_create(name="operator")
    viewer_group, _ = Group.objects.get_or_create(name="viewer")
    operator = User.objects.create_user("olivia", password="pw-operator")
    operator.groups.add(operator_group)
    viewer = User.objects.create_user("victor", password="pw-viewer")
    viewer.groups.add(viewer_group)
    outsider = User.objects.create_user("oscar", password="pw-outsider")
    return {"operator": operator, "viewer": viewer, "outsider": outsider}


@pytest.fixture
def rq_queue():
    """The test run's own queue, emptied before and after each test."""
    from sessions_app.services.dispatch import queue

    q = queue()
    q.empty()
    yield q
    q.empty()


def database_url() -> str:
    """The URL of the database the tests use (what a worker process is given)."""
    db = connection.settings_dict
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    host, port = db.get("HOST") or "127.0.0.1", db.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{db['NAME']}"


_database_url = database_url  # the name some test modules import


def program_env(**extra: str) -> dict[str, str]:
    """The environment of a program of Respawn's on the test database (test settings), with
    no OpenAI variable of the developer's (the SDK would read them on its own), and `extra`."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")},
        "DJANGO_SETTINGS_MODULE": "config.settings_test",
        "DATABASE_URL": database_url(),
        **extra,
    }


def run_python(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    """`python *args` in the checkout, as a person would run it; its standard output. The
    test fails, with the program's standard error, when the program fails."""
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def worker_env(transactional_db) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings_test",
        DATABASE_URL=database_url(),
        REDIS_URL=settings.REDIS_URL,
        RESPAWN_QUEUE=settings.RESPAWN_QUEUE,
        RESPAWN_LEASE_TTL=str(settings.RESPAWN_LEASE_TTL),
        RESPAWN_RECONCILE_INTERVAL=str(settings.RESPAWN_RECONCILE_INTERVAL),
        RESPAWN_DISPATCH_GRACE=str(settings.RESPAWN_DISPATCH_GRACE),
        # The demo agents' own knob (config.settings_test sets it in the environment).
        RESPAWN_SLOW_DELAY=os.environ["RESPAWN_SLOW_DELAY"],
        RESPAWN_MODEL_BACKOFF=str(settings.RESPAWN_MODEL_BACKOFF),
        RESPAWN_AGENTS=",".join(settings.RESPAWN_AGENTS),
        PYTHONPATH=os.pathsep.join([str(PACKAGES), *filter(None, [os.environ.get("PYTHONPATH")])]),
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.fixture
def start_worker(worker_env, rq_queue, tmp_path, request):
    """Start real worker processes; all are stopped (and their logs shown on failure)."""
    started: list[WorkerProcess] = []

    def start(name: str | None = None, **extra_env: str) -> WorkerProcess:
        name = name or f"w{len(started) + 1}-{os.getpid()}-{time.monotonic_ns() % 10**6}"
        env = {**worker_env, **extra_env}
        worker = WorkerProcess(env, tmp_path / f"{name}.log", name, settings.RESPAWN_QUEUE)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()  # and the worker process it forked, if the supervisor left it
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        for worker in started:
            print(f"--- log of worker {worker.name} ---\n{worker.log()}")


def pytest_collection_modifyitems(session, config, items):
    """Every test has an id of its own. The suite's processes (pytest-xdist) are dealt tests
    by id, so of several tests sharing one, all but one would silently not run. Schemathesis
    makes a test per API operation whose id, under this pytest, is its function's alone
    (test_api_schemathesis.py): each takes its full name, the operation in brackets. Any
    other repeated id stops the run, naming it."""
    from collections import Counter

    counts = Counter(item.nodeid for item in items)
    for item in items:
        if counts[item.nodeid] > 1 and item.name != item.nodeid.rpartition("::")[2]:
            item._id = type(item._id).parse(f"{item.parent.nodeid}::{item.name}")
    repeated = sorted(n for n, c in Counter(item.nodeid for item in items).items() if c > 1)
    if repeated:
        raise pytest.UsageError(f"tests sharing an id (one would not run in parallel): {repeated}")


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture(autouse=True)
def _live_server_idle_before_flush(request):
    """A test against the live server ends while a request it caused may still be running
    on the server's thread (an action's answer still rendering, a poll). The flush after the
    test truncates every table in one statement while that request's queries take their
    locks table by table: PostgreSQL may end the TRUNCATE as a deadlock, the tables are not
    emptied and the next test finds the last one's rows. So the flush waits for the server's
    request threads to end (the browser's pages are closed by then: no new requests)."""
    if "live_server" not in request.fixturenames:
        yield
        return
    # Set up after the flushing fixture, so torn down before it.
    request.getfixturevalue("transactional_db")
    yield
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        serving = [
            t
            for t in threading.enumerate()
            if "process_request_thread" in t.name and t is not threading.current_thread()
        ]
        if not serving:
            return
        for thread in serving:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


@pytest.fixture(scope="session", autouse=True)
def _close_connection_pools(django_db_setup, django_db_blocker, request):
    """Web processes pool their connections; give the pooled ones back before the test
    database is dropped, or PostgreSQL refuses to drop a database still in use."""
    from django.db import connections

    yield
    with django_db_blocker.unblock():
        for conn in connections.all():
            close_pool = getattr(conn, "close_pool", None)
            if close_pool is not None:
                close_pool()
    bouncer = getattr(request.config, "_respawn_pgbouncer", None)
    if bouncer is not None:
        # PgBouncer keeps its server connections to the test database open: close them,
        # or PostgreSQL refuses to drop it.
        connections.close_all()
        bouncer.drop_server_connections(settings.DATABASES["default"]["NAME"])


def run_session_inline(session, **overrides):
    """Run a stored session (the model or its id) in the test process, as a worker's job
    would: the lease, the engine, the Django store and this process's agents. `overrides`
    replace what the job passes run_session (config=, make_provider=, ...). Returns the
    engine's RunResult."""
    from agent_runtime.loop import run_session
    from sessions_app.runtime import agent_registry, run_config
    from sessions_app.store import DjangoEffects, DjangoRecords, session_store

    session_id = str(getattr(session, "id", session))
    job = {
        "store": session_store(),
        "agents": agent_registry(),
        "effects": DjangoEffects(),
        "config": run_config(),
        "records": DjangoRecords(),
    }
    return run_session(session_id, **{**job, **overrides})


def run_inline(session, **overrides):
    """run_session_inline, then the session as stored now: the model passed in, refreshed,
    or the one the id names."""
    from sessions_app.models import AgentSession

    result = run_session_inline(session, **overrides)
    if isinstance(session, AgentSession):
        session.refresh_from_db()
        return session
    return AgentSession.objects.get(id=result.session_id)


def assert_invariants(session) -> None:
    """What PostgreSQL must hold after any run, whatever fault met it."""
    from django.db.models import Count

    from sessions_app.models import Checkpoint, SideEffect, Status, Step

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


def without_ids(value, session_id: str):
    """A JSON value with the session id replaced, so traces of two sessions compare."""
    if isinstance(value, dict):
        return {k: without_ids(v, session_id) for k, v in value.items()}
    if isinstance(value, list):
        return [without_ids(v, session_id) for v in value]
    if isinstance(value, str):
        return value.replace(session_id, "<session>")
    return value


def live_conversation(session) -> list[tuple[str, dict]]:
    """Kinds and payloads of a stored session's live trace, without per-run system steps
    or its id: what must be equal between a resumed run and an uninterrupted one."""
    from sessions_app.models import Step

    return [
        (step.kind, without_ids(step.payload, str(session.id)))
        for step in Step.objects.filter(session=session, superseded_at__isnull=True).order_by("seq")
        if step.kind != "system"
    ]


def compat_gate(*args: str):
    """`manage.py check_state_compat *args` (the deploy gate): what it printed, and the
    CommandError it ended with (None when the deploy may go ahead)."""
    from io import StringIO

    from django.core.management import CommandError, call_command

    out = StringIO()
    try:
        call_command("check_state_compat", *args, stdout=out)
    except CommandError as exc:
        return out.getvalue(), exc
    return out.getvalue(), None
