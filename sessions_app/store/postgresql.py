"""The session store on PostgreSQL: every statement prepared on the server (or, behind a
transaction-mode pooler, sent with its parameters apart), an append in one statement and
loads without ORM instances. The rules it writes by are DjangoSessionStore's
(sessions_app.store)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import orjson
import psycopg
from django.conf import settings
from django.db import connection, connections
from psycopg.types.json import set_json_loads

from agent_runtime.state import SCHEMA_VERSION, StepKind
from agent_runtime.store import AppendResult, Lease, SessionHead, SessionNotFound, tail_start_at

from ..models import RUNNABLE, AgentSession, Checkpoint, ModelUsage, Status, Step
from ..redaction import scrubbed_json
from ..sealing import SEALED
from .base import AppendRows, DjangoSessionStore, LiveStep, SessionRow

SESSION_TABLE = AgentSession._meta.db_table
STEP_TABLE = Step._meta.db_table
CHECKPOINT_TABLE = Checkpoint._meta.db_table
USAGE_TABLE = ModelUsage._meta.db_table
SESSION_FIELDS = {field.column: field for field in AgentSession._meta.concrete_fields}
PREPARE_ON_REQUEST_ONLY = 2**31


def _json(value: Any) -> Any:
    # Django registers a text loader for jsonb on its connections (JSONField decodes).
    return json.loads(value) if isinstance(value, str | bytes) else value


def _prepare() -> bool:
    """Whether the store's statements are prepared on the server: not behind a pooler in
    transaction mode (RESPAWN_POOLER_SAFE), where the next transaction may run on another
    server connection, which does not have the statement (or has another one by its name)."""
    return not settings.RESPAWN_POOLER_SAFE


def _raw_connection(using: str = "default") -> psycopg.Connection[Any]:
    # Django's cursors check a persistent connection once per job or request before using
    # it (CONN_HEALTH_CHECKS); this path does not go through them, so it asks for the same
    # check: after a database restart a worker's first job reconnects instead of failing
    # on the connection the restart broke.
    conn = connections[using]
    conn.close_if_health_check_failed()
    conn.ensure_connection()
    conn.validate_no_broken_transaction()
    raw: psycopg.Connection[Any] = conn.connection
    if raw.prepare_threshold is None and _prepare():
        # Django turns psycopg's automatic preparation off (its own cursors bind on the
        # client and cannot prepare), which also ignores prepare=True. A threshold no query
        # reaches keeps automatic preparation off and honours an explicit request.
        raw.prepare_threshold = PREPARE_ON_REQUEST_ONLY
    return raw


# 19 digits in a row: maybe an integer beyond 64 bits, which orjson turns into a float
# without a word (-2**63 - 1 comes back as -9.223372036854776e+18, 10**30 as 1e+30). Found
# by mapping every digit to "0" and anything else to " " (bytes.translate) and looking for
# 19 zeros: over a long history 15 times faster than the regular expression [0-9]{19},
# which cost more than decoding the document.
_DIGITS_AS_ZERO = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_WIDE_DIGITS = b"0" * 19


def _has_wide_number(raw: bytes) -> bool:
    return _WIDE_DIGITS in raw.translate(_DIGITS_AS_ZERO)


def _loads(data: bytes | str) -> Any:
    """JSON decoding for long histories: orjson, several times faster than the standard
    library; the standard library for a document that may hold an integer wider than 64
    bits (PostgreSQL keeps it exactly, and so must what reads it back) or that orjson
    refuses."""
    raw = data.encode() if isinstance(data, str) else data
    if _has_wide_number(raw):
        return json.loads(data)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(data)


def fetch_all(sql: str, params: list[Any], *, using: str = "default") -> list[tuple[Any, ...]]:
    """The rows of a read the store's way (a prepared statement, binary results, jsonb as
    Python values): for a reader whose one statement is worth preparing (the LangGraph
    saver's get_tuple and list)."""
    return _fetch_all(sql, params, using=using)


def _fetch_all(sql: str, params: list[Any], *, using: str = "default") -> list[tuple[Any, ...]]:
    # Binary results: psycopg's C loaders read timestamps several times faster than the
    # text loader Django registers (which a long history spends a quarter of its load in).
    with connections[using].wrap_database_errors:
        with psycopg.Cursor(_raw_connection(using)) as cursor:
            set_json_loads(_loads, cursor)
            cursor.execute(sql, params, prepare=_prepare(), binary=True)
            return cursor.fetchall()


def _execute_prepared(
    sql: str, params: list[Any], *, using: str = "default"
) -> tuple[Any, ...] | None:
    """Run one statement on Django's connection as a server-side prepared statement and
    return its first row.

    Django's own cursors bind parameters on the client and never prepare: every append
    would send its payload escaped into the SQL text and have PostgreSQL parse and plan the
    CTE again. A psycopg cursor of the same connection sends the parameters apart and
    plans each shape of the statement once per connection (behind a transaction-mode
    pooler, RESPAWN_POOLER_SAFE, it is sent apart but unnamed, and planned each time).
    Transactions are unaffected: the connection's autocommit and any atomic block are
    Django's, as for any query. `using`: the database alias (a LangGraph saver's may be
    another than the project's default)."""
    with connections[using].wrap_database_errors:
        with psycopg.Cursor(_raw_connection(using)) as cursor:
            cursor.execute(sql, params, prepare=_prepare())
            return cursor.fetchone()


class PostgreSQLSessionStore(DjangoSessionStore):
    def claim(self, session_id: str, owner: str, ttl: float) -> Lease | None:
        """The portable claim's two UPDATEs in one statement. Expiry is on the database's
        clock (statement_timestamp(), as Django's Now(); now() is the transaction's start):
        a worker whose clock runs fast takes no live lease, one that runs slow keeps no
        dead worker's session waiting."""
        row = _execute_prepared(
            f"UPDATE {SESSION_TABLE} SET lease_owner = %s,"
            " lease_expires_at = statement_timestamp() + %s * interval '1 second',"
            " fencing_token = fencing_token + 1, status = %s,"
            " updated_at = statement_timestamp(),"
            " crash_count = CASE WHEN lease_owner IS NULL THEN 0"
            "  WHEN last_seq <= crash_seq + 1 THEN crash_count + 1 ELSE 1 END,"
            " crash_seq = CASE WHEN lease_owner IS NULL THEN crash_seq ELSE last_seq END"
            " WHERE id = %s::uuid AND status IN (%s, %s)"
            " AND (lease_owner IS NULL OR lease_expires_at <= statement_timestamp())"
            " RETURNING fencing_token, crash_count",
            [
                owner,
                float(ttl),
                Status.RUNNING.value,
                session_id,
                *(s.value for s in RUNNABLE),
            ],
        )
        if row is None:
            self._must_exist(session_id)
            return None
        return Lease(session_id, owner, row[0], crashes=row[1])

    def _session_row(self, session_id: str) -> SessionRow:
        """The portable load in two statements and without ORM instances (a 10,000-step
        history is 10,000 model instances there): this one, the session row with its head
        checkpoint, then the live steps."""
        newer = self._newer_columns()
        row = _execute_prepared(
            "SELECT s.agent, s.status, s.last_seq, c.seq, c.state, c.reason"
            f"{''.join(f', s.{column}' for column in newer)}"
            f" FROM {SESSION_TABLE} s LEFT JOIN LATERAL (SELECT seq, state, reason"
            f"  FROM {CHECKPOINT_TABLE} WHERE session_id = s.id AND seq = s.head"
            "  ORDER BY id DESC LIMIT 1) c ON s.head > 0"
            " WHERE s.id = %s::uuid",
            [session_id],
        )
        if row is None:
            raise SessionNotFound(session_id)
        agent, status, last_seq, checkpoint_seq, state, reason, *values = row
        return SessionRow(
            agent=agent,
            status=status,
            last_seq=last_seq,
            checkpoint=None if checkpoint_seq is None else (checkpoint_seq, _json(state), reason),
            **dict(zip(newer, values, strict=True)),
        )

    def _live_step_rows(self, session_id: str, start: int) -> Sequence[Sequence[Any]]:
        return _fetch_all(
            f"SELECT {', '.join(LiveStep._fields)} FROM {STEP_TABLE}"
            " WHERE session_id = %s::uuid AND superseded_at IS NULL AND seq >= %s ORDER BY seq",
            [session_id, start],
        )

    def load_tail(self, session_id: str) -> SessionHead:
        """load_head, with a statement between its two that finds the last model step and
        whether any live step is stored at another schema version than this code's: only
        the steps from `tail_start` on are read. Another version falls back to the whole
        load, which upgrades every step or names the one it cannot load."""
        row = self._session_row(session_id)
        head = self._frame(session_id, row)
        # Three lookups, each on an index: superseded steps (step_superseded), the last
        # model step (step_session_kind_seq, partial: the kind is a literal, so a
        # prepared statement's generic plan can still use it), a live step at another
        # schema version than this code's (step_version: rare versions are few rows).
        lookups = _execute_prepared(
            f"SELECT (SELECT count(*) FROM {STEP_TABLE}"
            "  WHERE session_id = %s::uuid AND superseded_at IS NOT NULL),"
            f" (SELECT max(seq) FROM {STEP_TABLE}"
            f"  WHERE session_id = %s::uuid AND kind = '{StepKind.MODEL.value}'"
            "  AND superseded_at IS NULL),"
            f" EXISTS (SELECT 1 FROM {STEP_TABLE} WHERE session_id = %s::uuid"
            "  AND superseded_at IS NULL"
            f"  AND (schema_version < {SCHEMA_VERSION} OR schema_version > {SCHEMA_VERSION}))",
            [session_id, session_id, session_id],
        )
        assert lookups is not None  # a SELECT without FROM: always one row
        superseded, last_model, other_version = lookups
        if other_version:
            return self.load_head(session_id)
        start = tail_start_at(last_model, head.head_seq)
        history, _ = self._live_steps(session_id, start)
        # Seqs run from 1 to last_seq without a gap, but for superseded steps that
        # retention compacted away: the live ones are the rest.
        live = row.last_seq - superseded - row.compacted_steps
        return replace(
            head,
            history=history,
            step_versions={SCHEMA_VERSION: live} if live else {},
            history_from=start,
        )

    def _hold(self, lease: Lease) -> bool:
        """A share lock on the session row: branches' tools hold it together, a claim
        waits for all of them."""
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT 1 FROM {SESSION_TABLE} WHERE id = %s AND fencing_token = %s"
                " AND lease_owner = %s FOR SHARE",
                [lease.session_id, lease.token, lease.owner],
            )
            return cursor.fetchone() is not None

    def _append(self, lease: Lease, rows: AppendRows) -> AppendResult:
        """One statement, one round trip: the fenced UPDATE of the session row, the INSERT
        of the steps numbered from the seq it returns, and the checkpoint's INSERT, in one
        CTE. Outside a transaction it commits on its own (autocommit); inside one (an
        operator action, a test) it is part of it. Either way it is atomic: when the fence
        does not match, the UPDATE returns no row and the INSERTs select nothing."""
        count = rows.count
        now = rows.now
        sets = [f"{column} = {column} + %s" for column in rows.increments]
        params: list[Any] = list(rows.increments.values())
        if rows.stale_before is None:
            sets.append("updated_at = %s")
            params.append(now)
        else:
            # updated_at is in three indexes (the dashboard's sort by latest activity):
            # writing it on every step would make every step's UPDATE a non-HOT one that
            # adds an entry to each of the table's nine indexes. Within a run it moves at
            # most once a second; status changes and the end of a run always move it.
            sets.append("updated_at = CASE WHEN updated_at < %s THEN %s ELSE updated_at END")
            params += [rows.stale_before, now]
        if rows.checkpoint is not None:
            # Both sides of SET read the old row, so head becomes the new last seq.
            sets.append("head = last_seq + %s")
            params.append(count)
        for column, value in rows.values.items():
            if value is None or value == "":
                # A constant, in the statement's text. (Setting the same NULL keeps the
                # update HOT: the partial index on incompatible_at sees no change.)
                sets.append(f"{column} = NULL" if value is None else f"{column} = ''")
            else:
                # No ORM field sees these values: each goes through its field's preparation
                # here, as in an update() (the scrubbing fields scrub what they hold; the
                # engine has redacted the steps already, but an error, say, came straight
                # from an exception).
                sets.append(f"{column} = %s")
                params.append(SESSION_FIELDS[column].get_db_prep_save(value, connection))
        params += [lease.session_id, lease.token, lease.owner]
        params += [lease.session_id, count, SCHEMA_VERSION, now]  # the SELECT list
        values = []
        for index, step in enumerate(rows.steps):
            values.append(
                "(%s, %s::varchar, %s::jsonb, %s::timestamptz, %s::timestamptz, %s::integer, "
                "%s::integer, %s::varchar)"
            )
            params += [
                index + 1,
                step.kind,
                scrubbed_json(step.payload),
                step.started_at,
                step.finished_at,
                step.tokens_in,
                step.tokens_out,
                step.idempotency_key,
            ]
        sql = [
            f"WITH fenced AS (UPDATE {SESSION_TABLE} SET {', '.join(sets)}"
            " WHERE id = %s::uuid AND fencing_token = %s AND lease_owner = %s"
            " RETURNING last_seq, cancel_requested, agent)",
            f", new_steps AS (INSERT INTO {STEP_TABLE} (session_id, seq, kind, payload,"
            " schema_version, started_at, finished_at, tokens_in, tokens_out, idempotency_key,"
            " created_at)"
            " SELECT %s::uuid, fenced.last_seq - %s + v.n, v.kind, v.payload, %s, v.started_at,"
            " v.finished_at, v.tokens_in, v.tokens_out, v.idempotency_key, %s::timestamptz"
            f" FROM fenced, (VALUES {', '.join(values)}) AS v (n, kind, payload, started_at,"
            " finished_at, tokens_in, tokens_out, idempotency_key))",
        ]
        if rows.checkpoint is not None:
            sql.append(
                f", new_checkpoint AS (INSERT INTO {CHECKPOINT_TABLE} (session_id, seq, state,"
                " schema_version, reason, created_at)"
                " SELECT %s::uuid, fenced.last_seq, %s::json, %s, %s, %s::timestamptz"
                " FROM fenced)"
            )
            params += [
                lease.session_id,
                scrubbed_json(rows.checkpoint.state),
                SCHEMA_VERSION,
                rows.checkpoint.reason,
                now,
            ]
        if rows.usage:
            # What the model calls cost, on the session's row of the day (one writer per
            # session: no contention between workers).
            usage_values = ", ".join(
                [
                    "(%s::varchar, %s::integer, %s::bigint, %s::bigint, %s::bigint, %s::bigint,"
                    " %s::numeric, %s::integer)"
                ]
                * len(rows.usage)
            )
            sql.append(
                f", usage AS (INSERT INTO {USAGE_TABLE} (day, session_id, agent, model, calls,"
                " tokens_in, tokens_out, cache_read_tokens, cache_write_tokens, cost,"
                " unpriced_calls)"
                " SELECT %s::date, %s::uuid, fenced.agent, v.model, v.calls, v.tokens_in,"
                " v.tokens_out, v.cache_read, v.cache_write, v.cost, v.unpriced"
                f" FROM fenced, (VALUES {usage_values}) AS v (model, calls, tokens_in, tokens_out,"
                " cache_read, cache_write, cost, unpriced)"
                " ON CONFLICT (session_id, day, model) DO UPDATE SET"
                f" calls = {USAGE_TABLE}.calls + EXCLUDED.calls,"
                f" tokens_in = {USAGE_TABLE}.tokens_in + EXCLUDED.tokens_in,"
                f" tokens_out = {USAGE_TABLE}.tokens_out + EXCLUDED.tokens_out,"
                f" cache_read_tokens = {USAGE_TABLE}.cache_read_tokens"
                " + EXCLUDED.cache_read_tokens,"
                f" cache_write_tokens = {USAGE_TABLE}.cache_write_tokens"
                " + EXCLUDED.cache_write_tokens,"
                f" cost = {USAGE_TABLE}.cost + EXCLUDED.cost,"
                f" unpriced_calls = {USAGE_TABLE}.unpriced_calls + EXCLUDED.unpriced_calls)"
            )
            params += [now.date(), lease.session_id]
            for usage in rows.usage:
                params += list(usage)
        sql.append(" SELECT last_seq, cancel_requested FROM fenced")
        row = _execute_prepared("".join(sql), params)
        if row is None:
            raise self._fenced_off(lease)
        last_seq, cancel_requested = row
        return AppendResult(
            seqs=list(range(last_seq - count + 1, last_seq + 1)),
            cancel_requested=cancel_requested,
        )


def item_rows(
    session_id: Any,
    *,
    item_key: str,
    escaped_key: str,
    actions: Sequence[str],
    limit: int | None = None,
) -> list[tuple[int, str, Any, dict[str, Any] | None]]:
    """An SDK session's item steps (sessions_app.openai_agents: live steps holding an item
    under `item_key`, user steps, operator steps whose action is one of `actions`), oldest
    first, the latest `limit` of them when given: (seq, kind, item, payload). A step that
    holds its item plainly (not escaped: no `escaped_key`, not sealed, not an operator's)
    comes with its item and no payload: the item alone to send and decode, and nothing
    more to do with it; any other step with its payload whole and no item. One prepared
    statement whose JSON comes as text, each value decoded once by orjson (psycopg's jsonb
    loader, one Python call per value on top, took twice as long)."""
    plain = (
        f"(payload ? '{item_key}' AND kind <> 'operator' AND NOT payload ? '{escaped_key}'"
        f" AND NOT payload ? '{SEALED}')"
    )
    sql = (
        f"SELECT seq, kind, CASE WHEN {plain} THEN (payload -> '{item_key}')::text END,"
        f" CASE WHEN NOT {plain} THEN payload::text END FROM {STEP_TABLE}"
        " WHERE session_id = %s AND superseded_at IS NULL"
        f" AND (payload ? '{item_key}' OR kind = 'user'"
        " OR (kind = 'operator' AND payload ->> 'action' = ANY(%s)))"
    )
    params: list[Any] = [session_id, list(actions)]
    if limit is None:
        rows = _fetch_all(sql + " ORDER BY seq", params)
    else:
        rows = _fetch_all(sql + " ORDER BY seq DESC LIMIT %s", [*params, limit])
        rows.reverse()
    return [
        (seq, kind, None, _loads(payload)) if item is None else (seq, kind, _loads(item), None)
        for seq, kind, item, payload in rows
    ]
