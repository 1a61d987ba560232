"""Respawn behind PgBouncer in transaction mode (RESPAWN_POOLER_SAFE=1).

A transaction-mode pooler hands each transaction whichever server connection is free, so
nothing may outlive a transaction on a connection: not a prepared statement, not a cursor
held open, not a session-level SET or advisory lock. These tests start a real PgBouncer
(Debian's package, installed by scripts/test-services.sh). The store contract, worker and
fault suites also run whole through one: `pytest --through-pgbouncer` (make test does).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from agent_runtime.state import NewCheckpoint, NewStep, SessionState, StepKind, model_payload
from sessions_app.models import AgentSession
from sessions_app.services.core import session_start
from sessions_app.store import DjangoSessionStore, session_store

from ..conftest import ROOT, wait_final
from ..fault.conftest import (
    assert_completed,
    kill_worker_process_only,
    wait_for_tool_results,
    worker_running_a_session,
)
from .conftest import source_lines_matching


def _test_database() -> str:
    return settings.DATABASES["default"]["NAME"]


@pytest.mark.parametrize("own_pgbouncer", [1], indirect=True)
def test_prepared_statements_break_behind_a_transaction_pooler(own_pgbouncer, db):
    """What pooler-safe mode is for: two clients of one server connection, each preparing
    its statements, trip over each other's; the same statements unprepared do not."""
    url = own_pgbouncer.url(_test_database())
    with psycopg.connect(url, autocommit=True) as a, psycopg.connect(url, autocommit=True) as b:
        a.execute("SELECT %s::int", [1], prepare=True)
        with pytest.raises(psycopg.errors.DuplicatePreparedStatement):
            # psycopg names b's first statement as it named a's, on the same server one
            b.execute("SELECT %s::text", ["x"], prepare=True)
        a.execute("DEALLOCATE ALL")
    with psycopg.connect(url, autocommit=True) as a, psycopg.connect(url, autocommit=True) as b:
        for n in range(20):
            assert a.execute("SELECT %s::int", [n], prepare=False).fetchone() == (n,)
            assert b.execute("SELECT %s::text", [str(n)], prepare=False).fetchone() == (str(n),)


def _store_round(store: DjangoSessionStore) -> None:
    """A claim, an append with a checkpoint and a load: the store's prepared statements."""
    session = AgentSession.objects.create(agent="echo", last_seq=0, step_count=0)
    lease = store.claim(str(session.id), "pooler-test", 30)
    assert lease is not None
    store.append(
        lease,
        [NewStep(kind=StepKind.MODEL, payload=model_payload("hello", [], {}, "scripted"))],
        checkpoint=NewCheckpoint(state=SessionState(agent_name="echo", agent_version="1")),
    )
    assert [s.seq for s in store.load_head(str(session.id)).history] == [1]


def _prepared_here() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        return cursor.fetchone()[0]


def test_pooler_safe_store_prepares_nothing_on_the_server(db, settings):
    """In one transaction (the test's), so one server connection even behind a pooler."""
    store = session_store()
    connection.ensure_connection()
    threshold = connection.connection.prepare_threshold
    try:
        settings.RESPAWN_POOLER_SAFE = True
        _store_round(store)
        assert _prepared_here() == 0
        settings.RESPAWN_POOLER_SAFE = False  # the direct-connection default prepares
        _store_round(store)
        assert _prepared_here() > 0
    finally:
        # Nothing left behind on a server connection that a pooler hands to others.
        with connection.cursor() as cursor:
            cursor.execute("DEALLOCATE ALL")
        connection.connection.prepare_threshold = threshold


def test_pooler_safe_setting_configures_the_database_connection():
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": "postgres://u@db.example:6432/respawn",
        "RESPAWN_PRODUCTION": "0",
    }
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "d = s.DATABASES['default']; "
        "print(s.RESPAWN_POOLER_SAFE, 'prepare_threshold' in d.get('OPTIONS', {}), "
        "d.get('OPTIONS', {}).get('prepare_threshold'), d.get('DISABLE_SERVER_SIDE_CURSORS'))"
    )

    def run(**extra: str) -> str:
        result = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env={**env, **extra},
            capture_output=True,
            text=True,
            check=True,
        )
        return result.stdout.split()

    assert run(RESPAWN_POOLER_SAFE="1") == ["True", "True", "None", "True"]
    assert run(RESPAWN_POOLER_SAFE="0") == ["False", "False", "None", "False"]


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_workers_behind_pgbouncer_lose_and_double_nothing(own_pgbouncer, start_worker):
    """Three workers share two server connections through PgBouncer in transaction mode;
    one worker process is killed mid-run. Every session finishes, once, intact."""
    through = {
        "DATABASE_URL": own_pgbouncer.url(_test_database()),
        "RESPAWN_POOLER_SAFE": "1",
    }
    sessions = [session_start(agent="slow", input="count to 4") for _ in range(6)]
    sessions += [
        session_start(agent="demo", input="what is (12*7)+3, then save it as a note")
        for _ in range(3)
    ]
    workers = [start_worker(**through) for _ in range(3)]
    wait_for_tool_results(sessions, 3, timeout=30)
    # Whichever worker is mid-run: the first one started may not have forked its worker
    # process yet, or may be between jobs.
    assert kill_worker_process_only(worker_running_a_session(workers, sessions))
    wait_final(sessions, timeout=90)
    for session in sessions:
        assert_completed(session)
    # The workers' statements went through PgBouncer, over at most two server connections.
    stats = own_pgbouncer.admin("SHOW STATS")
    row = next(line for line in stats.splitlines() if line.startswith(_test_database() + "|"))
    assert int(row.split("|")[1]) > 100  # total_xact_count
    for worker in workers:
        assert "prepared statement" not in worker.log(), worker.log()


def test_nothing_outlives_a_transaction_on_a_server_connection():
    """What a transaction-mode pooler cannot carry from one transaction to the next: no
    session-level advisory lock, no LISTEN, no session-level SET, no explicit prepare
    outside the store's switch (sessions_app.store.postgresql._prepare)."""
    forbidden = re.compile(
        r"pg_(try_)?advisory_lock\(|\bLISTEN\b|execute\(\s*f?[\"']\s*SET\s(?!LOCAL)"
        r"|prepare=True|\bDECLARE\b.*\bWITH HOLD\b",
        re.IGNORECASE,
    )
    # The one session-level SET: on a saver's or an SDK session's own connection, and never
    # behind a transaction-mode pooler (sessions_app.sdk_glue._plan_once returns when
    # RESPAWN_POOLER_SAFE is on; tests/langgraph/test_saver.py checks that it sets nothing).
    guarded = ("sessions_app/sdk_glue.py:", "SET plan_cache_mode = force_generic_plan; SET jit")
    found = [
        line
        for line in source_lines_matching(forbidden)
        if not (line.startswith(guarded[0]) and guarded[1] in line)
    ]
    assert found == []
