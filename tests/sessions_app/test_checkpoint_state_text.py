"""Checkpoint states as compact JSON text (`json`, migration 0028) and, for a process that
runs before the migration, on the `jsonb` column before it (sessions_app.fields); and the
conversion itself, in batches beside a writer (sessions_app/upkeep/state_text.py).
Committed data (transaction=True): the DDL and the workers' code see it."""

from __future__ import annotations

import uuid
from contextlib import contextmanager

import pytest
from django.db import connection
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
from sessions_app.selectors.core import _attention_querysets
from sessions_app.store import session_store
from tests.fixtures.loader import V1_SESSIONS, dump_blobs, insert_fixture

from ..conftest import run_session_inline as run_inline

pytestmark = pytest.mark.django_db(transaction=True)


def state_column() -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT data_type FROM information_schema.columns"
            " WHERE table_name = %s AND column_name = 'state'",
            [Checkpoint._meta.db_table],
        )
        return cursor.fetchone()[0]


def uncertain_state() -> dict:
    """Today's shape, with what a text encoding could get wrong: a call in doubt (the one
    key a query reads), text beyond ASCII, a line separator, an integer wider than 53 bits."""
    state = SessionState("demo", "1", uncertain_calls=["call_1_0"], final_answer="naïve ☃\u2028")
    state.counters.tokens_in = 2**60 + 1
    return state.to_dict()


@contextmanager
def state_column_as_jsonb():
    """The checkpoint's state column as it was before migration 0028 (jsonb), put back to
    json text afterwards."""
    table = Checkpoint._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} ALTER COLUMN state TYPE jsonb USING state::jsonb")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table} ALTER COLUMN state TYPE json USING state::json")


def exercise_states(ids: list[str], waiting: AgentSession) -> None:
    """What a release does with states: its loads, its appends, the ORM's reads, the
    attention queue."""
    store = session_store()
    for session_id in [*ids, str(waiting.id)]:
        head = store.load_head(session_id)
        assert head.checkpoint is None or head.checkpoint.state.agent_name
    loaded = store.load_head(str(waiting.id)).checkpoint
    assert loaded is not None and loaded.state.counters.tokens_in == 2**60 + 1
    assert Checkpoint.objects.get(session=waiting).state == uncertain_state()
    uncertain = _attention_querysets(timezone.now())["uncertain"]
    assert list(uncertain.values_list("id", flat=True)) == [waiting.id]


def test_states_are_compact_json_text_and_read_and_written_on_either_column():
    """Since 0028 the column is json text; a process started before the migration ran
    (jsonb) reads and writes them too."""
    if connection.vendor != "postgresql":
        pytest.skip("json and jsonb are PostgreSQL's")
    assert state_column() == "json"
    ids = [
        insert_fixture(name, version=version, session_id=str(uuid.uuid4()))
        for version in (1, 2)
        for name in V1_SESSIONS
    ]
    waiting = AgentSession.objects.create(
        agent="demo", status=Status.WAITING_INPUT, head=1, last_seq=1, step_count=1
    )
    Checkpoint.objects.create(session=waiting, seq=1, state=uncertain_state())
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT state::text FROM {Checkpoint._meta.db_table} WHERE session_id = %s",
            [waiting.id],
        )
        text = cursor.fetchone()[0]
    assert ", " not in text and '": ' not in text  # compact: no blanks after separators
    exercise_states(ids, waiting)
    mid_run = ids[V1_SESSIONS.index("mid_run")]
    before = dump_blobs()
    with state_column_as_jsonb():
        assert state_column() == "jsonb"
        assert dump_blobs() == before
        exercise_states(ids, waiting)
        # A resumed session writes its checkpoints through the store's append.
        assert run_inline(mid_run).outcome == "completed"
        written = Checkpoint.objects.filter(session_id=mid_run).order_by("-id").first()
        assert written is not None and written.state["schema_version"] == SCHEMA_VERSION
    assert state_column() == "json"


def test_a_checkpoint_is_read_back_equal():
    session = AgentSession.objects.create(agent="echo", last_seq=0)
    store = session_store()
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
    head = store.load_head(str(session.id)).checkpoint
    assert head is not None and head.state == state
    uncertain = _attention_querysets(timezone.now())["uncertain"]
    assert not uncertain.exists()  # not waiting for input
    AgentSession.objects.filter(id=session.id).update(status=Status.WAITING_INPUT)
    assert list(uncertain.values_list("id", flat=True)) == [session.id]


def test_a_state_filled_in_by_a_statement_stays_compact_in_its_own_order():
    """The one-statement writes of a program (an SDK session) and a LangGraph saver fill a
    state's agent and step count in from the row: the text stored is the state's compact
    JSON in its own key order with those values in it, as a worker's append stores it."""
    import json

    from sessions_app.redaction import fillable_json
    from sessions_app.store.writes import NewRow, append_program

    if connection.vendor != "postgresql":
        pytest.skip("the one-statement write is PostgreSQL's")
    session = AgentSession.objects.create(agent='an "odd" agent', status=Status.WAITING_INPUT)
    state = uncertain_state()
    state["pending_approval"] = None
    # Values that look like what is filled in are left alone.
    state["agent_state"] = {"version": 1, "data": {"agent": {"name": ""}, "steps": 0}}
    seq = append_program(
        session.id,
        [NewRow(kind="user", payload={"content": "hi"})],
        lease=None,
        runnable=[],
        checkpoint=state,
        agent_version="v9",
    )
    assert seq == 1
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT state::text FROM {Checkpoint._meta.db_table} WHERE session_id = %s",
            [session.id],
        )
        text = cursor.fetchone()[0]
    expected = {
        **state,
        "agent": {"name": 'an "odd" agent', "version": "v9"},
        "counters": {**state["counters"], "steps": 1},
    }
    assert text == json.dumps(expected, separators=(",", ":"))  # compact, in its order
    assert Checkpoint.objects.get(session=session).state == expected

    # A marker is unique to its call, and a path whose parent is not there is left out.
    filled = fillable_json({"a": {"b": 1}, "c": 2}, [("a", "b"), ("x", "y"), ("c",)])
    assert filled is not None
    text, markers = filled
    assert len(set(markers)) == 3 and markers[0] in text and markers[2] in text
    assert markers[1] not in text and '"x"' not in text
    assert fillable_json({"a": "sk-proj-FAKEfakeFAKEfake0123456789abcdefgh"}, []) is None
