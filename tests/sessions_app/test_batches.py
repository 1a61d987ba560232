"""Batch work on the Django side: the demo record table, batches keyed by their tool call,
progress in the session row, the API and the session page."""

from __future__ import annotations

import pytest
from django.urls import reverse

from sessions_app.models import ApiToken, Checkpoint, DemoBatch, DemoRecord
from sessions_app.services.core import checkpoint_rollback, session_start
from sessions_app.store import DjangoRecords

from ..conftest import run_inline

# Transactional: a run's heartbeat thread has a connection of its own and must see the
# session row the test created (a long run outlives the first heartbeat on a busy machine).
pytestmark = pytest.mark.django_db(transaction=True)


def test_migrate_session_migrates_each_record_once_and_reports_progress():
    session = run_inline(
        session_start(agent="migrate", input="migrate 450 records in batches of 100")
    )
    assert session.status == "completed", session.last_error
    assert session.final_answer == "Migrated 450 records in 5 batches of 100."
    records = DemoRecord.objects.filter(dataset=str(session.id))
    assert records.count() == 450
    assert set(records.values_list("migrations", flat=True)) == {1}
    assert not records.filter(output__isnull=True).exists()
    assert DemoBatch.objects.filter(dataset=str(session.id)).count() == 5
    # Each batch's records carry the key of the tool call that migrated them.
    keys = set(records.values_list("migrated_by_key", flat=True))
    assert keys == set(DemoBatch.objects.values_list("key", flat=True))
    assert (session.progress_done, session.progress_total) == (450, 450)
    cursors = [
        c.state["batch_cursor"]["done"]
        for c in Checkpoint.objects.filter(session=session).order_by("seq")
        if c.state["batch_cursor"]
    ]
    assert cursors == [100, 200, 300, 400, 450, 450]


def test_a_batch_run_again_with_its_key_migrates_nothing():
    records = DjangoRecords()
    records.ensure("ds", 10)
    first = records.migrate_batch("k1", dataset="ds", start=0, size=5)
    again = records.migrate_batch("k1", dataset="ds", start=0, size=5)
    assert (first.end, first.migrated, first.replayed) == (5, 5, False)
    assert (again.end, again.migrated, again.replayed) == (5, 5, True)
    assert (
        list(
            DemoRecord.objects.filter(dataset="ds")
            .order_by("number")
            .values_list("migrations", flat=True)
        )
        == [1] * 5 + [0] * 5
    )


@pytest.mark.parametrize("size", [10, 1000])
def test_a_batch_writes_its_records_in_statements_that_do_not_grow_with_it(size):
    """A batch's records are written one UPDATE per row sent together, not as one
    statement with a branch per row (whose planning grew with the square of the batch:
    minutes for 10,000 records while the batch held its locks). What is written is the
    same: each record migrated once, its output scrubbed through its field."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from agent_runtime.records import migrate_payload

    records = DjangoRecords()
    records.ensure("linear", size)
    with CaptureQueriesContext(connection) as queries:
        outcome = records.migrate_batch("k-linear", dataset="linear", start=0, size=size)
    assert outcome.migrated == size
    sent = [q["sql"] for q in queries.captured_queries]
    assert len(sent) <= 8, sent
    assert all(len(sql) < 2000 for sql in sent), [len(sql) for sql in sent]
    migrated = DemoRecord.objects.filter(dataset="linear")
    assert set(migrated.values_list("migrations", flat=True)) == {1}
    assert set(migrated.values_list("migrated_by_key", flat=True)) == {"k-linear"}
    first = migrated.get(number=1)
    assert first.output == migrate_payload(first.payload)


def test_progress_in_the_api_and_on_the_session_page(client, users):
    session = run_inline(
        session_start(agent="migrate", input="migrate 30 records in batches of 10")
    )
    raw = ApiToken.issue(users["viewer"])[1]
    body = client.get(f"/api/sessions/{session.id}", HTTP_AUTHORIZATION=f"Bearer {raw}").json()
    assert body["progress"] == {"done": 30, "total": 30, "note": None}
    other = session_start(agent="echo", input="hi")
    body = client.get(f"/api/sessions/{other.id}", HTTP_AUTHORIZATION=f"Bearer {raw}").json()
    assert body["progress"] is None
    client.force_login(users["viewer"])
    page = client.get(reverse("sessions:detail", args=[session.id])).content.decode()
    assert "30 / 30 (100%)" in page


def test_rollback_takes_progress_back_to_the_checkpoint(users):
    session = run_inline(
        session_start(agent="migrate", input="migrate 30 records in batches of 10")
    )
    second = [
        c
        for c in Checkpoint.objects.filter(session=session).order_by("seq")
        if (c.state["batch_cursor"] or {}).get("done") == 20
    ][0]
    checkpoint_rollback(session_id=session.id, checkpoint_seq=second.seq, actor=users["operator"])
    session.refresh_from_db()
    assert (session.progress_done, session.progress_total) == (20, 30)
