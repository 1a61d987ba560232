"""The migrate demo agent: one batch per turn, a checkpoint after each, and a crash in the
middle resumes at the batch it interrupted without migrating any record twice."""

from __future__ import annotations

import pytest

from agent_runtime.loop import Outcome
from agent_runtime.records import InMemoryRecords
from agent_runtime.store import InMemoryStore

from .helpers import Crash, CrashingStore, new_session
from .helpers import run as plain_run


def run(store, session_id, records, **kwargs):
    return plain_run(store, session_id, records=records, **kwargs)


def test_migrate_checkpoints_the_cursor_after_every_batch():
    store, records = InMemoryStore(), InMemoryRecords()
    session_id = new_session(store, "migrate", "migrate 1,000 records in batches of 100")
    result = run(store, session_id, records)
    assert result.outcome == Outcome.COMPLETED
    assert result.final_answer == "Migrated 1000 records in 10 batches of 100."
    session = store.session(session_id)
    cursors = [c.state.batch_cursor for c in session.checkpoints if c.state.batch_cursor]
    # One checkpoint per batch, and the final answer's with the last cursor.
    assert [c["done"] for c in cursors] == [*range(100, 1001, 100), 1000]
    assert all(c["total"] == 1000 for c in cursors)
    assert all(keys == [keys[0]] for keys in records.migrated_by.values())
    assert len(records.migrated_by) == 1000
    rows = records.records[session_id]
    assert rows[7]["output"] == {
        "schema": 2,
        "display_name": "Customer 7",
        "amount": {"cents": 259, "currency": "EUR"},
    }


def test_last_batch_may_be_short():
    store, records = InMemoryStore(), InMemoryRecords()
    session_id = new_session(store, "migrate", "migrate 250 records in batches of 100")
    assert run(store, session_id, records).outcome == Outcome.COMPLETED
    cursor = store.session(session_id).checkpoints[-1].state.batch_cursor
    assert cursor == {"done": 250, "total": 250, "size": 100}


@pytest.mark.parametrize("after_commit", [False, True])
def test_crash_mid_batch_resumes_at_that_batch_and_migrates_nothing_twice(after_commit):
    store, records = InMemoryStore(), InMemoryRecords()
    session_id = new_session(store, "migrate", "migrate 1000 records in batches of 100")
    # Steps: the user's, run_started, then per batch model, tool_call, tool_result. Step 14
    # is the result of batch 4, whose records the tool has already migrated.
    with pytest.raises(Crash):
        run(CrashingStore(store, at_seq=14, after_commit=after_commit), session_id, records)
    store.expire_lease(session_id)
    before = len(store.session(session_id).steps)
    assert run(store, session_id, records).outcome == Outcome.COMPLETED
    resumed = store.session(session_id).steps[before:]
    first_batch = next(s for s in resumed if s.kind in ("tool_call", "tool_result"))
    if after_commit:
        # Batch 4's result was committed: the resumed run goes on with batch 5.
        assert first_batch.kind == "tool_call"
        assert first_batch.payload["arguments"]["cursor"] == 400
    else:
        # Batch 4's call was recorded, its result not: the same call runs again, same key,
        # and finds the batch already migrated.
        assert first_batch.kind == "tool_result"
        assert first_batch.payload["output"]["start"] == 300
        assert first_batch.payload["output"]["replayed"] is True
    assert len(records.migrated_by) == 1000
    assert all(len(keys) == 1 for keys in records.migrated_by.values())
    assert len(records.batches) == 10


def test_migrate_without_a_record_source_is_an_error_the_model_sees():
    store = InMemoryStore()
    session_id = new_session(store, "migrate", "migrate 10 records in batches of 5")
    result = run(store, session_id, None)
    assert result.outcome == Outcome.COMPLETED
    assert "no record source" in result.final_answer
