"""Migration 0028's conversion of checkpoint states from jsonb to compact JSON text, on a
table with states of every shape and a worker appending beside it: every state comes out
equal, the worker's checkpoints written meanwhile included, and a run cut short goes on
from where it stopped (sessions_app/upkeep/state_text.py). `python -m bench.state_text`
does the same on a million steps and times the locks."""

from __future__ import annotations

import json
import threading
import uuid

import pytest
from django.db import connection, connections

from agent_runtime.state import NewCheckpoint, NewStep, SessionState, StepKind, user_payload
from sessions_app.models import AgentSession, Checkpoint
from sessions_app.store import session_store
from sessions_app.upkeep import state_text
from tests.fixtures.loader import V1_SESSIONS, insert_fixture

pytestmark = pytest.mark.django_db(transaction=True)

TABLE = Checkpoint._meta.db_table
# What a text encoding could get wrong: digits jsonb keeps exactly, text beyond ASCII, a
# line separator, escapes, blanks inside strings, an integer wider than 53 bits, nesting.
ODD = {
    "price": 0.1000000000000000055511151231257827,
    "big": 2**60 + 1,
    "text": 'naïve ☃\u2028 "quoted" \\ back, slash:  two  spaces\ttab',
    "nested": {"a": [1, 2.50, {"b": None, "c": [True, False]}], "": "empty key"},
}


@pytest.fixture
def jsonb_column():
    """The column as it was before 0028 (and json text again after the test, whatever
    happened)."""
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {TABLE} ALTER COLUMN state TYPE jsonb USING state::jsonb")
    yield
    if state_text.column_type() != "json":
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER IF EXISTS {state_text.TRIGGER} ON {TABLE}")
            cursor.execute(f"ALTER TABLE {TABLE} DROP COLUMN IF EXISTS state_text")
            cursor.execute(f"ALTER TABLE {TABLE} ALTER COLUMN state TYPE json USING state::json")


def states_as_jsonb() -> dict[int, str]:
    """Every checkpoint's state as jsonb text (one canonical form for either column)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id, state::jsonb::text FROM {TABLE}")
        return dict(cursor.fetchall())


def odd_sessions(count: int) -> list[AgentSession]:
    sessions = []
    for index in range(count):
        session = AgentSession.objects.create(agent="demo", head=1, last_seq=1, step_count=1)
        with connection.cursor() as cursor:
            # Written as jsonb keeps it (the ORM would go through today's field).
            cursor.execute(
                f"INSERT INTO {TABLE} (session_id, seq, state, schema_version, reason,"
                " created_at) VALUES (%s, 1, %s::jsonb, 1, 'auto', now())",
                [session.id, json.dumps({**ODD, "index": index})],
            )
        sessions.append(session)
    return sessions


class Appender(threading.Thread):
    """A worker appending steps with checkpoints to its session until told to stop."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.session = AgentSession.objects.create(agent="echo", last_seq=0)
        self.stop = threading.Event()
        self.appended = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            store = session_store()
            lease = store.claim(str(self.session.id), "appender", 60)
            assert lease is not None
            state = SessionState("echo", "1")
            while not self.stop.is_set():
                state.counters.tokens_in += 1
                store.append(
                    lease,
                    [NewStep(kind=StepKind.USER, payload=user_payload(f"hi {self.appended}"))],
                    checkpoint=NewCheckpoint(state=state),
                )
                self.appended += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            connections.close_all()


def test_every_state_comes_out_equal_with_a_worker_appending_beside_it(jsonb_column):
    if connection.vendor != "postgresql":
        pytest.skip("json and jsonb are PostgreSQL's")
    for name in V1_SESSIONS:
        insert_fixture(name, version=1, session_id=str(uuid.uuid4()))
    odd = odd_sessions(40)
    before = states_as_jsonb()
    appender = Appender()
    appender.start()
    try:
        while appender.appended < 5 and appender.error is None:
            threading.Event().wait(0.05)
        done = state_text.convert(batch=7)
        after_swap = appender.appended
        while appender.appended < after_swap + 5 and appender.error is None:
            threading.Event().wait(0.05)
    finally:
        appender.stop.set()
        appender.join(timeout=30)
    assert appender.error is None, appender.error
    assert state_text.column_type() == "json"
    assert done.rows >= len(before) and done.batches >= len(before) // 7
    after = states_as_jsonb()
    assert {k: after[k] for k in before} == before  # every state equal, to the digit
    # The worker's checkpoints, before, during and after the conversion, all there.
    mine = Checkpoint.objects.filter(session=appender.session)
    assert mine.count() == appender.appended
    last = SessionState.from_dict(mine.order_by("-seq").first().state)
    assert last.counters.tokens_in == appender.appended
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {TABLE} WHERE state::text ~ '[,:] '")
        # Compact, but for the blanks inside strings (ODD's own).
        assert cursor.fetchone()[0] <= 40
        cursor.execute("SELECT count(*) FROM pg_trigger WHERE tgname = %s", [state_text.TRIGGER])
        assert cursor.fetchone()[0] == 0
    assert Checkpoint.objects.get(session=odd[0]).state == {**ODD, "index": 0}
    # Run again: nothing to do.
    assert state_text.convert().already


def test_a_conversion_cut_short_goes_on_where_it_stopped(jsonb_column):
    if connection.vendor != "postgresql":
        pytest.skip("json and jsonb are PostgreSQL's")
    odd_sessions(12)
    before = states_as_jsonb()

    class Killed(Exception):
        pass

    def die(_text: str) -> None:
        raise Killed  # right after the column and the trigger, before any batch

    with pytest.raises(Killed):
        state_text.convert(batch=5, progress=die)
    assert state_text.column_type() == "jsonb"
    # Written while nobody converts: the trigger gives it its text already.
    odd_sessions(1)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {TABLE} WHERE state_text IS NOT NULL")
        assert cursor.fetchone()[0] == 1
    done = state_text.convert(batch=5)
    assert state_text.column_type() == "json"
    assert done.rows == 12  # the 13th had its text from the trigger
    after = states_as_jsonb()
    assert {k: after[k] for k in before} == before
    assert len(after) == 13
