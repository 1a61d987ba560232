"""Checkpoint states as compact JSON text (`json`, not `jsonb`) on PostgreSQL: migration
0024 converts the states stored before it, and back; this code writes and reads them
either side of it. Committed data (transaction=True): the migration executor sees it."""

from __future__ import annotations

import uuid

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from agent_runtime.state import (
    SCHEMA_VERSION,
    NewCheckpoint,
    NewStep,
    SessionState,
    StepKind,
    user_payload,
)
from sessions_app.models import AgentSession, Checkpoint, Status
from sessions_app.selectors import _attention_querysets
from sessions_app.store import DjangoSessionStore
from tests.fixtures.loader import V1_SESSIONS, dump_blobs, insert_fixture

from .test_state_upgrade import run_inline

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = "0023_session_failed_calls"


def state_column() -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT data_type FROM information_schema.columns"
            " WHERE table_name = %s AND column_name = 'state'",
            [Checkpoint._meta.db_table],
        )
        return cursor.fetchone()[0]


def stored_texts() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT state::text FROM {Checkpoint._meta.db_table} ORDER BY id")
        return [row[0] for row in cursor.fetchall()]


def uncertain_state() -> dict:
    """Today's shape, with what a text encoding could get wrong: a call in doubt (the one
    key a query reads), text beyond ASCII, a line separator, an integer wider than 53 bits."""
    state = SessionState("demo", "1", uncertain_calls=["call_1_0"], final_answer="naïve ☃\u2028")
    state.counters.tokens_in = 2**60 + 1
    return state.to_dict()


def test_0024_converts_the_stored_states_and_back():
    if connection.vendor != "postgresql":
        pytest.skip("json and jsonb are PostgreSQL's")
    call_command("migrate", "sessions_app", BEFORE, verbosity=0)
    try:
        old = MigrationExecutor(connection).loader.project_state(("sessions_app", BEFORE))
        models = (
            old.apps.get_model("sessions_app", "AgentSession"),
            old.apps.get_model("sessions_app", "Step"),
            old.apps.get_model("sessions_app", "Checkpoint"),
        )
        ids = [
            insert_fixture(name, version=version, session_id=str(uuid.uuid4()), models=models)
            for version in (1, 2)
            for name in V1_SESSIONS
        ]
        waiting = models[0].objects.create(
            agent="demo", status=Status.WAITING_INPUT, head=1, last_seq=1, step_count=1
        )
        models[2].objects.create(session=waiting, seq=1, state=uncertain_state())
        # This code on the jsonb column (the deploy gate runs it before migrate): a
        # resumed session writes its checkpoints through the store's append.
        mid_run = ids[V1_SESSIONS.index("mid_run")]
        assert run_inline(mid_run).outcome == "completed"
        assert state_column() == "jsonb"
        before = dump_blobs()

        call_command("migrate", "sessions_app", verbosity=0)
        assert state_column() == "json"
        assert dump_blobs() == before
        store = DjangoSessionStore()
        for session_id in [*ids, str(waiting.id)]:
            head = store.load_head(session_id)
            assert head.checkpoint is None or head.checkpoint.state.agent_name
        loaded = store.load_head(str(waiting.id)).checkpoint
        assert loaded is not None and loaded.state.counters.tokens_in == 2**60 + 1
        uncertain = _attention_querysets(timezone.now())["uncertain"]
        assert list(uncertain.values_list("id", flat=True)) == [waiting.id]

        call_command("migrate", "sessions_app", BEFORE, verbosity=0)
        assert state_column() == "jsonb"
        assert dump_blobs() == before
    finally:
        call_command("migrate", verbosity=0)


def test_a_checkpoint_is_stored_compact_and_read_back_equal():
    session = AgentSession.objects.create(agent="echo", last_seq=0)
    store = DjangoSessionStore()
    lease = store.claim(str(session.id), "test", 30)
    assert lease is not None
    state = SessionState.from_dict(uncertain_state())
    store.append(
        lease,
        [NewStep(kind=StepKind.USER, payload=user_payload("hi"))],
        checkpoint=NewCheckpoint(state=state),
    )
    Checkpoint.objects.create(session=session, seq=1, state=uncertain_state(), reason="manual")
    for checkpoint in Checkpoint.objects.filter(session=session):
        assert checkpoint.state == uncertain_state()
        assert checkpoint.state["schema_version"] == SCHEMA_VERSION
    if connection.vendor == "postgresql":
        assert state_column() == "json"
        for text in stored_texts():
            assert '": ' not in text and '", "' not in text  # no blanks after separators
    head = store.load_head(str(session.id)).checkpoint
    assert head is not None and head.state == state
    uncertain = _attention_querysets(timezone.now())["uncertain"]
    assert not uncertain.exists()  # not waiting for input
    AgentSession.objects.filter(id=session.id).update(status=Status.WAITING_INPUT)
    assert list(uncertain.values_list("id", flat=True)) == [session.id]
