"""Full-text search over steps, kept off the append path (PostgreSQL).

A durable step used to update a GIN index of its own payload in the append statement: the
largest share of a step's bytes (~780 of ~1,700) and of the statement's time beyond the
floor. Steps are now indexed in batches after they are written, by `index_pending`, which
every worker runs on a short timer (RESPAWN_SEARCH_INTERVAL seconds, default 2): a new
step is searchable within a few seconds, and the session list says when a search may miss
the newest steps.

What is indexed is one row per chunk of CHUNK consecutive steps of a session (`StepSearch`):
the stripped tsvector (lexemes, no positions) of the chunk's payloads. The search finds
sessions, not steps, so a chunk is as precise as a step and its index holds each word once
per chunk instead of once per step.

Which steps are new: the steps after a global cursor over step ids, less SLACK ids (a step
whose transaction committed after later ids were read is found on a later pass), each
session's indexed high-water mark deciding what is actually added, so a step is indexed
once however often it is seen. On other databases (SQLite, `make run`) the search reads the
steps themselves and nothing is indexed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from django.db import connection, transaction

from ..models import SearchCursor, Step, StepSearch

log = logging.getLogger("respawn.search")

CHUNK = 256  # steps of one session per indexed row
BATCH = 5000  # step ids one pass reads
SLACK = 10_000  # ids below the cursor looked at again, for late commits
# Only one indexer at a time across all workers: a transaction-level advisory lock.
LOCK_KEY = 0x52_53_50_4E  # "RSPN"

STEP_TABLE = Step._meta.db_table
SEARCH_TABLE = StepSearch._meta.db_table


@dataclass(frozen=True)
class Pass:
    steps: int  # steps added to the index
    cursor: int  # the highest step id seen
    behind: int  # step ids written since (0: caught up)
    locked_out: bool = False  # another worker was indexing


def enabled() -> bool:
    return connection.vendor == "postgresql"


def index_pending(*, batch: int = BATCH, budget: float = 1.0) -> Pass:
    """Index the steps written since the last pass, batch after batch for up to `budget`
    seconds; each batch is one transaction that moves the cursor with what it indexed."""
    if not enabled():
        return Pass(0, 0, 0)
    deadline = time.monotonic() + budget
    total = 0
    while True:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [LOCK_KEY])
                if not cursor.fetchone()[0]:
                    return Pass(total, 0, 0, locked_out=True)
                added, position, top = _index_batch(cursor, batch)
        total += added
        if position >= top or time.monotonic() > deadline:
            return Pass(total, position, max(0, top - position))


def _index_batch(cursor, batch: int) -> tuple[int, int, int]:
    state, _ = SearchCursor.objects.get_or_create(pk=1)
    start = max(0, state.step_id - SLACK)
    cursor.execute(f"SELECT coalesce(max(id), 0) FROM {STEP_TABLE}")
    top = cursor.fetchone()[0]
    # Always from SLACK ids back: a step of a transaction that committed after later ids
    # were read lies there (cheap: the ids' range on the primary key, and each session's
    # mark decides what is new).
    end = max(state.step_id, min(top, state.step_id + batch))
    if end <= start:
        return 0, state.step_id, top
    # Each session among these ids, from its indexed high-water mark on. The steps are
    # grouped into their chunks (seq // CHUNK) and merged into the chunk's row.
    cursor.execute(
        f"""
        WITH touched AS (
            SELECT DISTINCT session_id FROM {STEP_TABLE} WHERE id > %s AND id <= %s
        ), marks AS (
            SELECT t.session_id, coalesce(max(x.last_seq), 0) AS indexed
            FROM touched t LEFT JOIN {SEARCH_TABLE} x ON x.session_id = t.session_id
            GROUP BY t.session_id
        ), fresh AS (
            SELECT s.session_id, s.seq / {CHUNK} AS chunk, min(s.seq) AS first_seq,
                   max(s.seq) AS last_seq, count(*) AS n,
                   strip(to_tsvector('simple',
                                     string_agg((s.payload - '$sealed')::text, ' '))) AS tsv
            FROM {STEP_TABLE} s JOIN marks m ON m.session_id = s.session_id
            WHERE s.seq > m.indexed
            GROUP BY s.session_id, s.seq / {CHUNK}
        ), written AS (
            INSERT INTO {SEARCH_TABLE} (session_id, chunk, first_seq, last_seq, tsv)
            SELECT session_id, chunk, first_seq, last_seq, tsv FROM fresh
            ON CONFLICT (session_id, chunk) DO UPDATE SET
                tsv = {SEARCH_TABLE}.tsv || EXCLUDED.tsv,
                first_seq = least({SEARCH_TABLE}.first_seq, EXCLUDED.first_seq),
                last_seq = greatest({SEARCH_TABLE}.last_seq, EXCLUDED.last_seq)
            RETURNING 1
        )
        SELECT coalesce(sum(n), 0) FROM fresh
        """,
        [start, end],
    )
    added = int(cursor.fetchone()[0])
    SearchCursor.objects.filter(pk=1).update(step_id=end)
    return added, end, top


def lag() -> int:
    """Step ids written that the index has not reached yet (0 on other databases)."""
    if not enabled():
        return 0
    state = SearchCursor.objects.filter(pk=1).values_list("step_id", flat=True).first() or 0
    top = Step.objects.order_by("-id").values_list("id", flat=True).first() or 0
    return max(0, top - state)


def forget_sessions(session_ids: list) -> None:
    """Drop the index rows of sessions that are deleted (retention)."""
    StepSearch.objects.filter(session_id__in=session_ids).delete()


def rebuild() -> None:
    """Start over: the next passes index every step again."""
    with transaction.atomic():
        StepSearch.objects.all().delete()
        SearchCursor.objects.update_or_create(pk=1, defaults={"step_id": 0})


def reindex_session(session_id) -> None:
    """Index one session's steps again from its first (after a compaction removed some)."""
    StepSearch.objects.filter(session_id=session_id).delete()
    if not enabled():
        return
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {SEARCH_TABLE} (session_id, chunk, first_seq, last_seq, tsv)
            SELECT session_id, seq / {CHUNK}, min(seq), max(seq),
                   strip(to_tsvector('simple', string_agg((payload - '$sealed')::text, ' ')))
            FROM {STEP_TABLE} WHERE session_id = %s GROUP BY session_id, seq / {CHUNK}
            """,
            [str(session_id)],
        )
