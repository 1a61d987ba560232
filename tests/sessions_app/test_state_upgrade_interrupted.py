"""The upgrade, interrupted: a SIGKILLed `upgrade_state` process and a migration that dies
half-way both end, once run again, exactly where one uninterrupted run ends. Committed data
only (transaction=True), so other processes and the migration executor see it."""

from __future__ import annotations

import importlib
import signal
import subprocess
import sys
import uuid

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from agent_runtime import upgraders
from agent_runtime.state import SCHEMA_VERSION
from sessions_app.models import AgentSession, Checkpoint, Step
from tests.fixtures.loader import V1_SESSIONS, dump_blobs, dump_tables, insert_fixture, read_fixture

from ..conftest import ROOT, wait_for
from .test_state_upgrade import make_v99, messages_of

pytestmark = pytest.mark.django_db(transaction=True)

MIGRATION = importlib.import_module("sessions_app.migrations.0009_upgrade_state_blobs")


def insert_copies(copies: int, models=None) -> list[str]:
    ids = []
    for n in range(copies):
        for i, name in enumerate(V1_SESSIONS):
            session_id = str(uuid.UUID(int=n * 16 + i + 1))
            ids.append(insert_fixture(name, session_id=session_id, models=models))
    return ids


def restore(tables: dict[str, list[dict]]) -> None:
    Step.objects.all().delete()
    Checkpoint.objects.all().delete()
    AgentSession.objects.all().delete()
    AgentSession.objects.bulk_create([AgentSession(**row) for row in tables["sessions"]])
    Step.objects.bulk_create([Step(**row) for row in tables["steps"]])
    Checkpoint.objects.bulk_create([Checkpoint(**row) for row in tables["checkpoints"]])


def manage(env, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_upgrade_killed_half_way_and_run_again_ends_as_one_uninterrupted_run(worker_env):
    insert_copies(30)  # 1080 steps, 180 checkpoints
    total_steps = Step.objects.count()
    v1 = dump_tables()

    process = subprocess.Popen(
        [sys.executable, "manage.py", "upgrade_state", "--batch-size", "10", "--pause", "0.01"],
        cwd=ROOT,
        env=worker_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # Checkpoints go first; kill it some batches into the steps.
        wait_for(
            lambda: Step.objects.filter(schema_version=SCHEMA_VERSION).count() >= 100,
            timeout=60,
            interval=0.01,
            what="upgrade_state to commit some batches of steps",
        )
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait(timeout=10)
    done = Step.objects.filter(schema_version=SCHEMA_VERSION).count()
    assert 100 <= done < total_steps, "killed half-way"
    assert done % 10 == 0, "whole batches committed, nothing of the one it died in"

    again = manage(worker_env, "upgrade_state", "--batch-size", "10")
    assert again.returncode == 0, again.stderr
    assert f"upgraded {total_steps - done}," in again.stdout
    assert "checkpoints: read 180, upgraded 0, already current 180, refused 0" in again.stdout
    interrupted = dump_tables()

    restore(v1)
    assert dump_tables() == v1
    once = manage(worker_env, "upgrade_state", "--batch-size", "10")
    assert once.returncode == 0, once.stderr
    assert dump_tables() == interrupted


def test_gate_exits_non_zero_from_the_shell_and_names_the_session(worker_env):
    for name in V1_SESSIONS:
        insert_fixture(name)
    ok = manage(worker_env, "check_state_compat")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    broken = read_fixture("mid_run")["session"]["id"]
    make_v99(broken)
    gate = manage(worker_env, "check_state_compat")
    assert gate.returncode == 1
    assert f"FAIL {broken}" in gate.stdout and "failed: checkpoint at seq 7" in gate.stdout
    assert gate.stderr.strip() == (
        f"CommandError: 1 of 3 session(s) would fail to load with this code "
        f"(schema version {SCHEMA_VERSION})"
    )


def test_data_migration_interrupted_half_way_carries_on_and_reverses_exactly(monkeypatch):
    call_command("migrate", "sessions_app", "0007", verbosity=0)
    try:
        old = MigrationExecutor(connection).loader.project_state(
            ("sessions_app", "0007_audit_append_only")
        )
        models = tuple(
            old.apps.get_model("sessions_app", name)
            for name in ("AgentSession", "Step", "Checkpoint")
        )
        ids = insert_copies(3, models=models)  # as the v1 release stored them
        v1 = dump_blobs()

        # The deploy gate runs with the new code before its migrations (no new columns yet).
        out = _call("check_state_compat")
        assert "all 9 session(s) load with this code" in out
        assert "live sessions per schema version: v1: 9" in out
        # upgrade_state waits for migrate: old workers may still be serving this data.
        with pytest.raises(CommandError, match="unapplied migrations .*sessions_app.0008"):
            _call("upgrade_state")
        assert dump_blobs() == v1

        # Die in the fifth batch of steps (checkpoints come first, 18 of them: 2 batches).
        monkeypatch.setattr(MIGRATION, "BATCH_SIZE", 10)
        original, calls = upgraders.STEP_UPGRADERS[1], []

        def dies_half_way(kind, payload):
            calls.append(1)
            if len(calls) == 45:
                raise KeyboardInterrupt("killed mid-migration")
            return original(kind, payload)

        monkeypatch.setitem(upgraders.STEP_UPGRADERS, 1, dies_half_way)
        with pytest.raises(KeyboardInterrupt):
            call_command("migrate", "sessions_app", "0009", verbosity=0)
        # 0009 rewrites to version 2, as released; 0015 takes them to 3.
        assert Checkpoint.objects.filter(schema_version=2).count() == 18
        assert Step.objects.filter(schema_version=2).count() == 40
        assert not MigrationExecutor(connection).loader.applied_migrations.get(
            ("sessions_app", "0009_upgrade_state_blobs")
        )

        monkeypatch.setitem(upgraders.STEP_UPGRADERS, 1, original)
        call_command("migrate", "sessions_app", "0009", verbosity=0)
        assert set(Step.objects.values_list("schema_version", flat=True)) == {2}
        for session_id in ids[:4]:
            name = V1_SESSIONS[ids.index(session_id)]
            expected = read_fixture(name)["v1_messages"]
            assert messages_of(session_id) == _renamed(expected, name, session_id)
        carried_on = dump_blobs()

        # Reversible: back to exactly the v1 blobs; forward again in one go, same result.
        call_command("migrate", "sessions_app", "0008", verbosity=0)
        assert dump_blobs() == v1
        call_command("migrate", "sessions_app", "0009", verbosity=0)
        assert dump_blobs() == carried_on

        # On to version 3 with 0015, and back to exactly the version 2 blobs.
        call_command("migrate", "sessions_app", "0015", verbosity=0)
        assert set(Step.objects.values_list("schema_version", flat=True)) == {SCHEMA_VERSION}
        assert set(Checkpoint.objects.values_list("schema_version", flat=True)) == {SCHEMA_VERSION}
        assert all(c.state["agent_state"] is None for c in Checkpoint.objects.all())
        for session_id in ids[:4]:
            name = V1_SESSIONS[ids.index(session_id)]
            expected = read_fixture(name)["v1_messages"]
            assert messages_of(session_id) == _renamed(expected, name, session_id)
        call_command("migrate", "sessions_app", "0014", verbosity=0)
        assert dump_blobs() == carried_on
    finally:
        call_command("migrate", verbosity=0)


def test_the_data_migration_is_not_one_transaction():
    assert MIGRATION.Migration.atomic is False


def _call(*args: str) -> str:
    from io import StringIO

    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def _renamed(messages: list[dict], name: str, session_id: str) -> list[dict]:
    import json

    old = read_fixture(name)["session"]["id"]
    return json.loads(json.dumps(messages).replace(old, session_id))
