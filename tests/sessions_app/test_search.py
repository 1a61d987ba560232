"""The dashboard's search, indexed off the append: searchable within a pass, every step
once, late commits caught, one indexer at a time, a worker doing it by itself."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection
from django.urls import reverse

from sessions_app.models import AgentSession, SearchCursor, Step, StepSearch
from sessions_app.services.core import session_start
from sessions_app.upkeep import search
from sessions_app.upkeep.retention import apply_retention, parse_policy

from ..conftest import _database_url, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def found(client, q: str) -> list:
    return [s.id for s in client.get(reverse("sessions:list"), {"q": q}).context["sessions"]]


def add_steps(session: AgentSession, texts: list[str]) -> None:
    start = session.last_seq
    Step.objects.bulk_create(
        Step(session=session, seq=start + i, kind="system", payload={"event": "note", "text": t})
        for i, t in enumerate(texts, start=1)
    )
    AgentSession.objects.filter(id=session.id).update(last_seq=start + len(texts))
    session.refresh_from_db()


def test_a_step_is_searchable_after_a_pass_and_the_page_says_when_it_may_lag(client, users):
    client.force_login(users["viewer"])
    session = session_start(agent="echo", input="hello", title="a test")
    add_steps(session, ["the wombat escaped"])
    page = client.get(reverse("sessions:list"), {"q": "wombat"})
    assert [s.id for s in page.context["sessions"]] == []
    assert b"search index is" in page.content and b"behind" in page.content
    result = search.index_pending()
    assert result.steps == 2 and result.behind == 0
    page = client.get(reverse("sessions:list"), {"q": "wombat"})
    assert [s.id for s in page.context["sessions"]] == [session.id]
    assert b"search-lag" not in page.content


def test_chunks_hold_each_step_once_across_passes(client, users):
    client.force_login(users["viewer"])
    session = session_start(agent="echo", input="first words", title="chunks")
    add_steps(session, [f"word{i}" for i in range(search.CHUNK + 40)])
    search.index_pending(batch=100)  # several batches, one budget
    search.index_pending()
    add_steps(session, ["platypus"])
    search.index_pending()
    search.index_pending()
    rows = list(StepSearch.objects.filter(session=session).order_by("chunk"))
    assert [r.chunk for r in rows] == [0, 1]
    assert (rows[0].first_seq, rows[-1].last_seq) == (1, session.last_seq)
    for word in ("word0", f"word{search.CHUNK + 39}", "platypus", "first"):
        assert found(client, word) == [session.id], word
    # Stripped: lexemes only, no positions, each once per chunk.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tsv::text FROM sessions_app_stepsearch WHERE session_id = %s AND chunk = 1",
            [str(session.id)],
        )
        text = cursor.fetchone()[0]
    assert ":" not in text and text.count("'platypus'") == 1


def test_a_step_committed_after_a_later_one_was_read_is_still_indexed(client, users):
    client.force_login(users["viewer"])
    session = session_start(agent="echo", input="early", title="late")
    search.index_pending()
    add_steps(session, ["latecomer"])
    # As if the pass had already read ids beyond this step while its transaction was
    # still open: the cursor is past it.
    SearchCursor.objects.filter(pk=1).update(step_id=Step.objects.order_by("-id").first().id + 3)
    search.index_pending()
    assert found(client, "latecomer") == [session.id]


def test_one_indexer_at_a_time():
    session_start(agent="echo", input="hello")
    with psycopg.connect(_database_url(), autocommit=False) as other:
        other.execute("SELECT pg_advisory_xact_lock(%s)", [search.LOCK_KEY])
        assert search.index_pending().locked_out
    assert search.index_pending().steps >= 1


def test_retention_takes_deleted_and_compacted_steps_out_of_the_search(client, users):
    from datetime import timedelta

    from django.utils import timezone

    client.force_login(users["viewer"])
    old = session_start(agent="echo", input="the ocelot", title="old one")
    AgentSession.objects.filter(id=old.id).update(
        status="completed", updated_at=timezone.now() - timedelta(days=40)
    )
    kept = session_start(agent="echo", input="hello", title="kept one")
    add_steps(kept, ["a narwhal"])
    Step.objects.filter(session=kept, seq=2).update(
        superseded_at=timezone.now() - timedelta(days=40)
    )
    search.index_pending()
    assert found(client, "ocelot") == [old.id] and found(client, "narwhal") == [kept.id]
    apply_retention(
        parse_policy({"default": {"delete_after_days": 30, "superseded_after_days": 30}})
    )
    assert not StepSearch.objects.filter(session_id=old.id).exists()
    assert found(client, "narwhal") == [] and found(client, "hello") == [kept.id]


@pytest.mark.integration
def test_a_worker_indexes_new_steps_within_seconds(client, users, start_worker):
    client.force_login(users["viewer"])
    start_worker(RESPAWN_SEARCH_INTERVAL="0.5")
    session = session_start(agent="echo", input="tell me about the axolotl", title="a test")
    wait_for(
        lambda: found(client, "axolotl") == [session.id],
        timeout=20,
        what="the worker to index the session's steps",
    )
    assert SearchCursor.objects.get().step_id >= Step.objects.filter(session=session).first().id
