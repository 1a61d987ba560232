"""The Django implementation of agent_runtime's SessionStore.

Every write is one transaction that starts with a conditional UPDATE of the session row on
(id, fencing_token, lease_owner): a worker whose lease was taken over or fenced off by an
operator action matches no row and writes nothing. On PostgreSQL an append is a single
statement (that UPDATE, the steps' INSERT and the checkpoint's INSERT in one CTE), so a
durable step costs one round trip and one commit.

Every blob read goes through agent_runtime.upgraders; a blob this code cannot load raises
IncompatibleSchemaError naming the checkpoint or step, before anything is written.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator, Sequence
from datetime import timedelta
from decimal import Decimal
from typing import Any

import orjson
import psycopg
from django.conf import settings
from django.db import IntegrityError, connection, connections, transaction
from django.db.models import Case, F, Value, When
from django.db.models.signals import post_migrate, pre_migrate
from django.dispatch import receiver
from django.utils import timezone
from psycopg.types.json import set_json_loads

from agent_runtime.records import BatchOutcome, demo_record, migrate_payload
from agent_runtime.state import (
    SCHEMA_VERSION,
    CheckpointRecord,
    NewCheckpoint,
    NewStep,
    SessionStatus,
    StepKind,
    StepRecord,
    validate_step_payload,
)
from agent_runtime.store import (
    AppendResult,
    BranchAppend,
    HeartbeatResult,
    Lease,
    LeaseLost,
    SessionHead,
    SessionNotFound,
    tail_of,
    tail_start_at,
)
from agent_runtime.upgraders import IncompatibleSchemaError, load_state, load_step_payload

from .models import (
    RUNNABLE,
    AgentSession,
    AuditAction,
    AuditEvent,
    Checkpoint,
    DemoBatch,
    DemoRecord,
    ModelUsage,
    SideEffect,
    Status,
    Step,
)
from .redaction import scrub, scrubbed_json

SESSION_TABLE = AgentSession._meta.db_table
STEP_TABLE = Step._meta.db_table
CHECKPOINT_TABLE = Checkpoint._meta.db_table
USAGE_TABLE = ModelUsage._meta.db_table
PREPARE_ON_REQUEST_ONLY = 2**31
# How stale a running session's updated_at may get between two of its steps.
UPDATED_AT_RESOLUTION = timedelta(seconds=1)

STEP_RECORD_FIELDS = (
    "id",
    "seq",
    "kind",
    "payload",
    "schema_version",
    "started_at",
    "finished_at",
    "tokens_in",
    "tokens_out",
    "idempotency_key",
    "superseded_at",
)


def step_record(step: Step) -> StepRecord:
    """An ORM step as the engine sees it, its payload upgraded to the current schema."""
    try:
        loaded = load_step_payload(step.kind, step.payload, step.schema_version)
    except IncompatibleSchemaError as exc:
        raise exc.at(f"step seq {step.seq} ({step.kind})") from exc
    return StepRecord(
        seq=step.seq,
        kind=StepKind(step.kind),
        payload=loaded.value,
        schema_version=step.schema_version,
        started_at=step.started_at,
        finished_at=step.finished_at,
        tokens_in=step.tokens_in,
        tokens_out=step.tokens_out,
        idempotency_key=step.idempotency_key,
        superseded=step.superseded_at is not None,
    )


# Per database (alias and name): the session table's columns, once it has every column
# this code knows. The deploy gate (check_state_compat) loads sessions with the next
# release's code before that release's migrations ran, when the newest ones (agent_version,
# compacted_steps) do not exist yet. Forgotten whenever migrations run.
_SESSION_COLUMNS: dict[tuple[str, str], set[str]] = {}


@receiver(pre_migrate)
@receiver(post_migrate)
def _schema_may_have_changed(**kwargs: Any) -> None:
    _SESSION_COLUMNS.clear()


def _session_has(column: str) -> bool:
    key = (connection.alias, str(connection.settings_dict.get("NAME")))
    columns = _SESSION_COLUMNS.get(key)
    if columns is None:
        with connection.cursor() as cursor:
            description = connection.introspection.get_table_description(cursor, SESSION_TABLE)
        columns = {c.name for c in description}
        if {f.column for f in AgentSession._meta.concrete_fields} <= columns:
            _SESSION_COLUMNS[key] = columns
    return column in columns


def model_usage(steps: Sequence[NewStep]) -> list[tuple[Any, ...]]:
    """The model steps among `steps`, summed by model: (model, calls, tokens in, tokens
    out, cache-read tokens, cache-write tokens, cost, unpriced calls)."""
    by_model: dict[str, list[Any]] = {}
    for step in steps:
        if step.kind != StepKind.MODEL:
            continue
        usage = step.payload.get("usage") or {}
        row = by_model.setdefault(
            str(step.payload.get("model") or "")[:200], [0, 0, 0, 0, 0, Decimal(0), 0]
        )
        row[0] += 1
        row[1] += step.tokens_in
        row[2] += step.tokens_out
        row[3] += int(usage.get("cache_read_tokens") or 0)
        row[4] += int(usage.get("cache_write_tokens") or 0)
        row[5] += Decimal(str(usage.get("cost") or 0))
        row[6] += 1 if usage.get("unpriced") else 0
    return [(model, *row) for model, row in by_model.items()]


def _json(value: Any) -> Any:
    # Django registers a text loader for jsonb on its connections (JSONField decodes).
    return json.loads(value) if isinstance(value, str | bytes) else value


def _prepare() -> bool:
    """Whether the store's statements are prepared on the server: not behind a pooler in
    transaction mode (RESPAWN_POOLER_SAFE), where the next transaction may run on another
    server connection, which does not have the statement (or has another one by its name)."""
    return not settings.RESPAWN_POOLER_SAFE


def _raw_connection():
    # Django's cursors check a persistent connection once per job or request before using
    # it (CONN_HEALTH_CHECKS); this path does not go through them, so it asks for the same
    # check: after a database restart a worker's first job reconnects instead of failing
    # on the connection the restart broke.
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    connection.validate_no_broken_transaction()
    raw = connection.connection
    if raw.prepare_threshold is None and _prepare():
        # Django turns psycopg's automatic preparation off (its own cursors bind on the
        # client and cannot prepare), which also ignores prepare=True. A threshold no query
        # reaches keeps automatic preparation off and honours an explicit request.
        raw.prepare_threshold = PREPARE_ON_REQUEST_ONLY
    return raw


def _loads(data: bytes | str) -> Any:
    """JSON decoding for long histories: orjson, several times faster than the standard
    library; the standard library where orjson refuses what PostgreSQL accepts (integers
    wider than 64 bits)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def _fetch_all(sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
    # Binary results: psycopg's C loaders read timestamps several times faster than the
    # text loader Django registers (which a long history spends a quarter of its load in).
    with connection.wrap_database_errors:
        with psycopg.Cursor(_raw_connection()) as cursor:
            set_json_loads(_loads, cursor)
            cursor.execute(sql, params, prepare=_prepare(), binary=True)
            return cursor.fetchall()


def _execute_prepared(sql: str, params: list[Any]) -> tuple[Any, ...] | None:
    """Run one statement on Django's connection as a server-side prepared statement and
    return its first row.

    Django's own cursors bind parameters on the client and never prepare: every append
    would send its payload escaped into the SQL text and have PostgreSQL parse and plan the
    CTE again. A psycopg cursor of the same connection sends the parameters apart and
    plans each shape of the statement once per connection (behind a transaction-mode
    pooler, RESPAWN_POOLER_SAFE, it is sent apart but unnamed, and planned each time).
    Transactions are unaffected: the connection's autocommit and any atomic block are
    Django's, as for any query."""
    with connection.wrap_database_errors:
        with psycopg.Cursor(_raw_connection()) as cursor:
            cursor.execute(sql, params, prepare=_prepare())
            return cursor.fetchone()


class DjangoSessionStore:
    def claim(self, session_id: str, owner: str, ttl: float) -> Lease | None:
        if connection.vendor == "postgresql":
            return self._claim_postgresql(session_id, owner, ttl)
        return self._claim_portable(session_id, owner, ttl)

    def _claim_postgresql(self, session_id: str, owner: str, ttl: float) -> Lease | None:
        """The same claim as the portable one, in one statement: take a free lease
        (no crash to count) or an expired one (count the takeovers in a row with no
        progress in between: the dead run wrote at most its own run_started step)."""
        now = timezone.now()
        row = _execute_prepared(
            f"UPDATE {SESSION_TABLE} SET lease_owner = %s, lease_expires_at = %s,"
            " fencing_token = fencing_token + 1, status = %s, updated_at = %s,"
            " crash_count = CASE WHEN lease_owner IS NULL THEN 0"
            "  WHEN last_seq <= crash_seq + 1 THEN crash_count + 1 ELSE 1 END,"
            " crash_seq = CASE WHEN lease_owner IS NULL THEN crash_seq ELSE last_seq END"
            " WHERE id = %s::uuid AND status IN (%s, %s)"
            " AND (lease_owner IS NULL OR lease_expires_at <= %s)"
            " RETURNING fencing_token, crash_count",
            [
                owner,
                now + timedelta(seconds=ttl),
                Status.RUNNING.value,
                now,
                session_id,
                *(s.value for s in RUNNABLE),
                now,
            ],
        )
        if row is None:
            if not AgentSession.objects.filter(id=session_id).exists():
                raise SessionNotFound(session_id)
            return None
        return Lease(session_id, owner, row[0], crashes=row[1])

    def _claim_portable(self, session_id: str, owner: str, ttl: float) -> Lease | None:
        now = timezone.now()
        runnable = AgentSession.objects.filter(id=session_id, status__in=RUNNABLE)
        taken = {
            "lease_owner": owner,
            "lease_expires_at": now + timedelta(seconds=ttl),
            "fencing_token": F("fencing_token") + 1,
            "status": Status.RUNNING,
            "updated_at": now,
        }
        # A free lease (released cleanly, or freed by a person): no crash to count.
        claimed = runnable.filter(lease_owner__isnull=True).update(**taken, crash_count=0)
        if not claimed:
            # An expired lease: its holder died (or froze). Count the takeovers in a row with
            # no progress in between: the dead run wrote at most its own run_started step.
            claimed = runnable.filter(lease_owner__isnull=False, lease_expires_at__lte=now).update(
                **taken,
                crash_count=Case(
                    When(last_seq__lte=F("crash_seq") + 1, then=F("crash_count") + 1),
                    default=Value(1),
                ),
                crash_seq=F("last_seq"),
            )
        if not claimed:
            if not AgentSession.objects.filter(id=session_id).exists():
                raise SessionNotFound(session_id)
            return None
        # Owner names are unique per run, so this reads back our own token (or nothing,
        # if the lease was already lost again, which the first fenced write will notice).
        row = (
            AgentSession.objects.filter(id=session_id, lease_owner=owner)
            .values_list("fencing_token", "crash_count")
            .first()
        )
        return None if row is None else Lease(session_id, owner, row[0], crashes=row[1])

    def load_head(self, session_id: str) -> SessionHead:
        if connection.vendor == "postgresql":
            return self._load_head_postgresql(session_id)
        return self._load_head_portable(session_id)

    def load_tail(self, session_id: str) -> SessionHead:
        if connection.vendor == "postgresql":
            return self._load_head_postgresql(session_id, tail=True)
        return tail_of(self._load_head_portable(session_id))

    def load_history(self, session_id: str) -> list[StepRecord]:
        if connection.vendor == "postgresql":
            return self._live_steps(session_id, 1)[0]
        return self._load_head_portable(session_id).history

    def _load_head_postgresql(self, session_id: str, *, tail: bool = False) -> SessionHead:
        """The portable load in two statements and without ORM instances (a 10,000-step
        history is 10,000 model instances there): the session row with its head
        checkpoint, then the live steps. Same columns, same upgraders.

        With tail=True (load_tail), a third statement first finds the last model step
        and whether any live step is stored at another schema version than this code's,
        and only the steps from `tail_start` on are read. Another version falls back to
        the whole load, which upgrades every step or names the one it cannot load."""
        version_column = "s.agent_version" if _session_has("agent_version") else "''"
        compacted_column = "s.compacted_steps" if _session_has("compacted_steps") else "0"
        deadline_column = "s.deadline_at" if _session_has("deadline_at") else "NULL"
        row = _execute_prepared(
            f"SELECT s.agent, s.status, s.head, s.last_seq, c.seq, c.state, c.reason,"
            f" {version_column}, {compacted_column}, {deadline_column}"
            f" FROM {SESSION_TABLE} s LEFT JOIN LATERAL (SELECT seq, state, reason"
            f"  FROM {CHECKPOINT_TABLE} WHERE session_id = s.id AND seq = s.head"
            "  ORDER BY id DESC LIMIT 1) c ON s.head > 0"
            " WHERE s.id = %s::uuid",
            [session_id],
        )
        if row is None:
            raise SessionNotFound(session_id)
        (
            agent,
            status,
            _head,
            last_seq,
            checkpoint_seq,
            state,
            reason,
            agent_version,
            compacted,
            deadline,
        ) = row
        checkpoint = None
        applied: tuple[str, ...] = ()
        if checkpoint_seq is not None:
            try:
                loaded = load_state(_json(state))
            except IncompatibleSchemaError as exc:
                raise exc.at(f"checkpoint at seq {checkpoint_seq}") from exc
            applied = loaded.applied
            checkpoint = CheckpointRecord(
                seq=checkpoint_seq,
                state=loaded.value,
                reason=reason,
                schema_version=loaded.stored_version,
            )
        head_seq = checkpoint.seq if checkpoint else 0
        start = 1
        if tail:
            # Three lookups, each on an index: superseded steps (step_superseded), the last
            # model step (step_session_kind_seq, partial: the kind is a literal, so a
            # prepared statement's generic plan can still use it), a live step at another
            # schema version than this code's (step_version: rare versions are few rows).
            superseded, last_model, other_version = _execute_prepared(
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
            if other_version:
                return self._load_head_postgresql(session_id)
            start = tail_start_at(last_model, head_seq)
        history, versions = self._live_steps(session_id, start)
        if tail:
            # Seqs run from 1 to last_seq without a gap, but for superseded steps that
            # retention compacted away: the live ones are the rest.
            live = last_seq - superseded - compacted
            versions = {SCHEMA_VERSION: live} if live else {}
        return SessionHead(
            session_id=str(session_id),
            agent_name=agent,
            status=SessionStatus(status),
            head_seq=head_seq,
            last_seq=last_seq,
            checkpoint=checkpoint,
            history=history,
            upgraders_applied=applied,
            step_versions=versions,
            history_from=start,
            agent_version=agent_version,
            deadline=deadline,
        )

    def _live_steps(self, session_id: str, start: int) -> tuple[list[StepRecord], dict[int, int]]:
        """The live steps from seq `start` on, upgraded, and their count by stored version."""
        history = []
        versions: dict[int, int] = {}
        for seq, kind, payload, version, started, finished, t_in, t_out, key in _fetch_all(
            f"SELECT seq, kind, payload, schema_version, started_at, finished_at, tokens_in,"
            f" tokens_out, idempotency_key FROM {STEP_TABLE}"
            " WHERE session_id = %s::uuid AND superseded_at IS NULL AND seq >= %s ORDER BY seq",
            [session_id, start],
        ):
            try:
                loaded = load_step_payload(kind, _json(payload), version)
            except IncompatibleSchemaError as exc:
                raise exc.at(f"step seq {seq} ({kind})") from exc
            versions[version] = versions.get(version, 0) + 1
            history.append(
                StepRecord(
                    seq=seq,
                    kind=StepKind(kind),
                    payload=loaded.value,
                    schema_version=version,
                    started_at=started,
                    finished_at=finished,
                    tokens_in=t_in,
                    tokens_out=t_out,
                    idempotency_key=key,
                    superseded=False,
                )
            )
        return history, versions

    def _load_head_portable(self, session_id: str) -> SessionHead:
        # Only the columns a load needs: `check_state_compat` runs this with the next
        # release's code before that release's migrations, when newer columns don't exist.
        columns = ["id", "agent", "status", "head", "last_seq"]
        for newer in ("agent_version", "deadline_at"):
            if _session_has(newer):
                columns.append(newer)
        try:
            session = AgentSession.objects.only(*columns).get(id=session_id)
        except AgentSession.DoesNotExist:
            raise SessionNotFound(session_id) from None
        checkpoint = None
        applied: tuple[str, ...] = ()
        if session.head:
            row = (
                Checkpoint.objects.filter(session_id=session_id, seq=session.head)
                .only("id", "seq", "state", "reason", "schema_version")
                .order_by("-id")
                .first()
            )
            if row is not None:
                try:
                    loaded = load_state(row.state)
                except IncompatibleSchemaError as exc:
                    raise exc.at(f"checkpoint at seq {row.seq}") from exc
                applied = loaded.applied
                checkpoint = CheckpointRecord(
                    seq=row.seq,
                    state=loaded.value,
                    reason=row.reason,
                    schema_version=loaded.stored_version,
                )
        steps = (
            Step.objects.filter(session_id=session_id, superseded_at__isnull=True)
            .only(*STEP_RECORD_FIELDS)
            .order_by("seq")
        )
        history = [step_record(s) for s in steps]
        versions: dict[int, int] = {}
        for record in history:
            versions[record.schema_version] = versions.get(record.schema_version, 0) + 1
        return SessionHead(
            session_id=str(session.id),
            agent_name=session.agent,
            status=SessionStatus(session.status),
            head_seq=checkpoint.seq if checkpoint else 0,
            last_seq=session.last_seq,
            checkpoint=checkpoint,
            history=history,
            upgraders_applied=applied,
            step_versions=versions,
            agent_version=session.agent_version if _session_has("agent_version") else "",
            deadline=session.deadline_at if _session_has("deadline_at") else None,
        )

    def append(
        self,
        lease: Lease,
        steps: Sequence[NewStep],
        *,
        checkpoint: NewCheckpoint | None = None,
        status: SessionStatus | None = None,
        error: str | None = None,
        release: bool = False,
    ) -> AppendResult:
        for step in steps:
            validate_step_payload(step.kind, step.payload)
        append = (
            self._append_postgresql if connection.vendor == "postgresql" else self._append_portable
        )
        if status != SessionStatus.COMPLETED:
            return append(lease, steps, checkpoint, status, error, release)
        with transaction.atomic():
            result = append(lease, steps, checkpoint, status, error, release)
            count_failed_calls(lease.session_id)
            return result

    def _append_postgresql(
        self,
        lease: Lease,
        steps: Sequence[NewStep],
        checkpoint: NewCheckpoint | None,
        status: SessionStatus | None,
        error: str | None,
        release: bool,
    ) -> AppendResult:
        """One statement, one round trip: the fenced UPDATE of the session row, the INSERT
        of the steps numbered from the seq it returns, and the checkpoint's INSERT, in one
        CTE. Outside a transaction it commits on its own (autocommit); inside one (an
        operator action, a test) it is part of it. Either way it is atomic: when the fence
        does not match, the UPDATE returns no row and the INSERTs select nothing."""
        count = len(steps)
        now = timezone.now()
        # No ORM field sees these values: scrub them here, as the fields do (the engine has
        # redacted the steps already; the error, say, came straight from an exception).
        sets = [
            "last_seq = last_seq + %s",
            "step_count = step_count + %s",
            "tokens_in = tokens_in + %s",
            "tokens_out = tokens_out + %s",
            # A lease holder writes only after its load_head succeeded: whatever code marked
            # the session incompatible before, this code loads it. (Setting the same NULL
            # keeps the update HOT: the partial index sees no change.)
            "incompatible_reason = ''",
            "incompatible_at = NULL",
            "incompatible_code_schema = NULL",
            "incompatible_agent_version = ''",
        ]
        params: list[Any] = [
            count,
            count,
            sum(s.tokens_in for s in steps),
            sum(s.tokens_out for s in steps),
        ]
        cost = sum(float((s.payload.get("usage") or {}).get("cost") or 0) for s in steps)
        if cost:
            sets.append("cost = cost + %s::numeric")
            params.append(Decimal(str(cost)))
        if status is not None or error is not None or release:
            sets.append("updated_at = %s")
            params.append(now)
        else:
            # updated_at is in three indexes (the dashboard's sort by latest activity):
            # writing it on every step would make every step's UPDATE a non-HOT one that
            # adds an entry to each of the table's nine indexes. Within a run it moves at
            # most once a second; status changes and the end of a run always move it.
            sets.append("updated_at = CASE WHEN updated_at < %s THEN %s ELSE updated_at END")
            params += [now - UPDATED_AT_RESOLUTION, now]
        if checkpoint is not None:
            # Both sides of SET read the old row, so head becomes the new last seq.
            sets.append("head = last_seq + %s")
            params.append(count)
            if checkpoint.state.final_answer is not None:
                sets.append("final_answer = %s")
                params.append(scrub(checkpoint.state.final_answer))
            cursor = checkpoint.state.batch_cursor
            if cursor is not None:
                sets.append("progress_done = %s")
                sets.append("progress_total = %s")
                params += [cursor.get("done"), cursor.get("total")]
        if status is not None:
            sets.append("status = %s")
            params.append(status.value)
        if error is not None:
            sets.append("last_error = %s")
            params.append(scrub(error))
        if release:
            sets.append("lease_owner = NULL")
            sets.append("lease_expires_at = NULL")
        params += [lease.session_id, lease.token, lease.owner]
        params += [lease.session_id, count, SCHEMA_VERSION, now]  # the SELECT list
        rows = []
        for index, step in enumerate(steps):
            rows.append(
                "(%s, %s::varchar, %s::jsonb, %s::timestamptz, %s::timestamptz, %s::integer, "
                "%s::integer, %s::varchar)"
            )
            params += [
                index + 1,
                step.kind.value,
                scrubbed_json(step.payload),
                step.started_at,
                step.finished_at or now,
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
            f" FROM fenced, (VALUES {', '.join(rows)}) AS v (n, kind, payload, started_at,"
            " finished_at, tokens_in, tokens_out, idempotency_key))",
        ]
        if checkpoint is not None:
            sql.append(
                f", new_checkpoint AS (INSERT INTO {CHECKPOINT_TABLE} (session_id, seq, state,"
                " schema_version, reason, created_at)"
                " SELECT %s::uuid, fenced.last_seq, %s::json, %s, %s, %s::timestamptz"
                " FROM fenced)"
            )
            params += [
                lease.session_id,
                scrubbed_json(checkpoint.state.to_dict()),
                SCHEMA_VERSION,
                checkpoint.reason.value,
                now,
            ]
        usage = model_usage(steps)
        if usage:
            # What the model calls cost, on the session's row of the day (one writer per
            # session: no contention between workers).
            values = ", ".join(
                [
                    "(%s::varchar, %s::integer, %s::bigint, %s::bigint, %s::bigint, %s::bigint,"
                    " %s::numeric, %s::integer)"
                ]
                * len(usage)
            )
            sql.append(
                f", usage AS (INSERT INTO {USAGE_TABLE} (day, session_id, agent, model, calls,"
                " tokens_in, tokens_out, cache_read_tokens, cache_write_tokens, cost,"
                " unpriced_calls)"
                " SELECT %s::date, %s::uuid, fenced.agent, v.model, v.calls, v.tokens_in,"
                " v.tokens_out, v.cache_read, v.cache_write, v.cost, v.unpriced"
                f" FROM fenced, (VALUES {values}) AS v (model, calls, tokens_in, tokens_out,"
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
            for row in usage:
                params += list(row)
        sql.append(" SELECT last_seq, cancel_requested FROM fenced")
        row = _execute_prepared("".join(sql), params)
        if row is None:
            raise LeaseLost(f"session {lease.session_id}: lease token {lease.token} was fenced off")
        last_seq, cancel_requested = row
        return AppendResult(
            seqs=list(range(last_seq - count + 1, last_seq + 1)),
            cancel_requested=cancel_requested,
        )

    def _append_portable(
        self,
        lease: Lease,
        steps: Sequence[NewStep],
        checkpoint: NewCheckpoint | None,
        status: SessionStatus | None,
        error: str | None,
        release: bool,
    ) -> AppendResult:
        """The same write through the ORM, in one transaction (SQLite: `make run`)."""
        count = len(steps)
        now = timezone.now()
        changes: dict[str, Any] = {
            "last_seq": F("last_seq") + count,
            "step_count": F("step_count") + count,
            "tokens_in": F("tokens_in") + sum(s.tokens_in for s in steps),
            "tokens_out": F("tokens_out") + sum(s.tokens_out for s in steps),
            # As on PostgreSQL: within a run, at most once a second (see there).
            "updated_at": now
            if status is not None or error is not None or release
            else Case(
                When(updated_at__lt=now - UPDATED_AT_RESOLUTION, then=Value(now)),
                default=F("updated_at"),
            ),
            # A lease holder writes only after its load_head succeeded: whatever code marked
            # the session incompatible before, this code loads it.
            "incompatible_reason": "",
            "incompatible_at": None,
            "incompatible_code_schema": None,
            "incompatible_agent_version": "",
        }
        cost = sum(float((s.payload.get("usage") or {}).get("cost") or 0) for s in steps)
        if cost:
            changes["cost"] = F("cost") + Decimal(str(cost))
        if checkpoint is not None:
            # Both sides of SET read the old row, so head becomes the new last seq.
            changes["head"] = F("last_seq") + count
            if checkpoint.state.final_answer is not None:
                changes["final_answer"] = checkpoint.state.final_answer
            cursor = checkpoint.state.batch_cursor
            if cursor is not None:
                changes["progress_done"] = cursor.get("done")
                changes["progress_total"] = cursor.get("total")
        if status is not None:
            changes["status"] = status.value
        if error is not None:
            changes["last_error"] = error
        if release:
            changes["lease_owner"] = None
            changes["lease_expires_at"] = None
        with transaction.atomic():
            matched = AgentSession.objects.filter(
                id=lease.session_id, fencing_token=lease.token, lease_owner=lease.owner
            ).update(**changes)
            if not matched:
                raise LeaseLost(
                    f"session {lease.session_id}: lease token {lease.token} was fenced off"
                )
            last_seq, cancel_requested = AgentSession.objects.filter(
                id=lease.session_id
            ).values_list("last_seq", "cancel_requested")[0]
            first = last_seq - count + 1
            Step.objects.bulk_create(
                [
                    Step(
                        session_id=lease.session_id,
                        seq=first + index,
                        kind=step.kind.value,
                        payload=step.payload,
                        started_at=step.started_at,
                        finished_at=step.finished_at or now,
                        tokens_in=step.tokens_in,
                        tokens_out=step.tokens_out,
                        idempotency_key=step.idempotency_key,
                        created_at=now,
                    )
                    for index, step in enumerate(steps)
                ]
            )
            if checkpoint is not None:
                Checkpoint.objects.create(
                    session_id=lease.session_id,
                    seq=last_seq,
                    state=checkpoint.state.to_dict(),
                    reason=checkpoint.reason.value,
                    created_at=now,
                )
            usage = model_usage(steps)
            if usage:
                agent = AgentSession.objects.filter(id=lease.session_id).values_list(
                    "agent", flat=True
                )[0]
                for model, calls, t_in, t_out, c_read, c_write, cost, unpriced in usage:
                    row, _ = ModelUsage.objects.get_or_create(
                        session_id=lease.session_id,
                        day=now.date(),
                        model=model,
                        defaults={"agent": agent},
                    )
                    ModelUsage.objects.filter(pk=row.pk).update(
                        calls=F("calls") + calls,
                        tokens_in=F("tokens_in") + t_in,
                        tokens_out=F("tokens_out") + t_out,
                        cache_read_tokens=F("cache_read_tokens") + c_read,
                        cache_write_tokens=F("cache_write_tokens") + c_write,
                        cost=F("cost") + cost,
                        unpriced_calls=F("unpriced_calls") + unpriced,
                    )
        return AppendResult(
            seqs=list(range(first, last_seq + 1)), cancel_requested=cancel_requested
        )

    def append_branch_result(
        self, lease: Lease, step: NewStep, *, call_id: str, after_seq: int
    ) -> BranchAppend:
        with transaction.atomic():
            # The row lock orders concurrent branches of one turn: each sees the results
            # committed before it, so one and only one sees the last call answered.
            locked = (
                AgentSession.objects.select_for_update()
                .filter(id=lease.session_id, fencing_token=lease.token, lease_owner=lease.owner)
                .values_list("id", flat=True)
            )
            if not locked:
                raise LeaseLost(
                    f"session {lease.session_id}: lease token {lease.token} was fenced off"
                )
            live = Step.objects.filter(session_id=lease.session_id, superseded_at__isnull=True)
            model = live.filter(seq=after_seq).values_list("payload", flat=True).first() or {}
            calls = {c["id"] for c in model.get("tool_calls") or []}
            answered = (
                set(
                    live.filter(seq__gt=after_seq, kind=StepKind.TOOL_RESULT.value).values_list(
                        "payload__call_id", flat=True
                    )
                )
                & calls
            )
            if call_id in answered:
                return BranchAppend(seq=None, unanswered=len(calls - answered))
            seq = self.append(lease, [step]).seqs[0]
            return BranchAppend(seq=seq, unanswered=len(calls - answered - {call_id}))

    def heartbeat(self, lease: Lease, ttl: float) -> HeartbeatResult:
        now = timezone.now()
        alive = AgentSession.objects.filter(
            id=lease.session_id, fencing_token=lease.token, lease_owner=lease.owner
        ).update(lease_expires_at=now + timedelta(seconds=ttl))
        cancel = (
            AgentSession.objects.filter(id=lease.session_id)
            .values_list("cancel_requested", flat=True)
            .first()
        )
        return HeartbeatResult(alive=bool(alive), cancel_requested=bool(cancel))

    def release(self, lease: Lease) -> bool:
        return bool(
            AgentSession.objects.filter(
                id=lease.session_id, fencing_token=lease.token, lease_owner=lease.owner
            ).update(lease_owner=None, lease_expires_at=None)
        )

    def report_progress(self, lease: Lease, *, done: int, total: int | None, message: str) -> bool:
        return bool(
            AgentSession.objects.filter(
                id=lease.session_id, fencing_token=lease.token, lease_owner=lease.owner
            ).update(
                progress_done=max(0, done),
                progress_total=None if total is None else max(0, total),
                progress_note=message[:200],
            )
        )

    @contextlib.contextmanager
    def fenced(self, lease: Lease) -> Iterator[None]:
        """One transaction around a tool's writes that first checks the lease's token and
        owner on the session row and holds a share lock on it until commit: a claim (an
        UPDATE of that row) waits until the writes are in, and writes of a fenced-off run
        never commit."""
        try:
            with transaction.atomic():
                if connection.vendor == "postgresql":
                    with connection.cursor() as cursor:
                        cursor.execute(
                            f"SELECT 1 FROM {SESSION_TABLE} WHERE id = %s AND fencing_token = %s"
                            " AND lease_owner = %s FOR SHARE",
                            [lease.session_id, lease.token, lease.owner],
                        )
                        held = cursor.fetchone() is not None
                else:  # SQLite: an IMMEDIATE transaction holds the database's write lock
                    held = AgentSession.objects.filter(
                        id=lease.session_id, fencing_token=lease.token, lease_owner=lease.owner
                    ).exists()
                if not held:
                    raise LeaseLost(
                        f"session {lease.session_id}: lease token {lease.token} was fenced "
                        "off; the tool's write was refused"
                    )
                yield
        finally:
            _close_in_tool_thread()

    def report_late_call(self, lease: Lease, report: dict[str, Any]) -> None:
        """An audit record (the trace is the new holder's), shown on the session's page
        and counted in "needs attention"."""
        try:
            AuditEvent.objects.create(
                actor=None,
                actor_label=f"worker {report.get('worker') or lease.owner}",
                action=LATE_CALL_ACTION,
                session_id=lease.session_id,
                after=report,
            )
        finally:
            _close_in_tool_thread()

    def thread_cleanup(self) -> None:
        """Close the calling thread's connections (the heartbeat thread's, when it ends)."""
        connections.close_all()


def count_failed_calls(session_id: Any) -> int:
    """Count the session's failed tool calls (its live error results, less a person's
    rejections and the results an operator corrected) on its row. Served by the
    step_failed partial index; the corrections are read only when something failed."""
    failed = {
        seq
        for seq, failure in Step.objects.filter(
            session_id=session_id,
            kind=StepKind.TOOL_RESULT.value,
            payload__status="error",
            superseded_at__isnull=True,
        ).values_list("seq", "payload__failure")
        if failure != "rejected"
    }
    if failed:
        corrected = Step.objects.filter(
            session_id=session_id,
            kind=StepKind.OPERATOR.value,
            payload__action="correct_result",
            superseded_at__isnull=True,
        ).values_list("payload__result_seq", flat=True)
        failed -= {seq for seq in corrected if isinstance(seq, int)}
    AgentSession.objects.filter(id=session_id).update(failed_calls=len(failed))
    return len(failed)


# The audit action of a non-idempotent call started by a run that was then fenced off.
LATE_CALL_ACTION = AuditAction.LATE_TOOL_CALL.value


def _close_in_tool_thread() -> None:
    """Tools run on worker threads (for their timeout); their connections would otherwise
    outlive them. Not inside a transaction: that is the tool's, still going."""
    if threading.current_thread() is threading.main_thread():
        return
    if not connection.in_atomic_block:
        connections.close_all()


class DjangoEffects:
    """Side effects of the demo tools, one row per idempotency key."""

    def record(self, key: str, *, session_id: str, tool: str, payload: dict[str, Any]) -> bool:
        try:
            try:
                with transaction.atomic():
                    SideEffect.objects.create(
                        key=key, session_id=session_id, tool=tool, payload=payload
                    )
                return True
            except IntegrityError:
                SideEffect.objects.filter(key=key).update(attempts=F("attempts") + 1)
                return False
        finally:
            _close_in_tool_thread()


class DjangoRecords:
    """The migrate demo agent's records (agent_runtime.records.RecordSource)."""

    def ensure(self, dataset: str, total: int) -> None:
        if DemoRecord.objects.filter(dataset=dataset).count() >= total:
            return
        for first in range(1, total + 1, 1000):
            DemoRecord.objects.bulk_create(
                [
                    DemoRecord(dataset=dataset, number=n, payload=demo_record(n))
                    for n in range(first, min(first + 1000, total + 1))
                ],
                ignore_conflicts=True,
            )

    def migrate_batch(self, key: str, *, dataset: str, start: int, size: int) -> BatchOutcome:
        try:
            with transaction.atomic():
                # The batch row and the records' migration commit together: a crash leaves
                # either both or neither, and the unique key makes a re-run find the row.
                batch = DemoBatch.objects.create(
                    key=key, dataset=dataset, start=start, end=start, migrated=0
                )
                now = timezone.now()
                rows = list(
                    DemoRecord.objects.select_for_update()
                    .filter(dataset=dataset, number__gt=start, number__lte=start + size)
                    .only("id", "payload")
                )
                for row in rows:
                    row.output = migrate_payload(row.payload)
                    row.migrated_at = now
                    row.migrated_by_key = key
                    row.migrations = F("migrations") + 1
                DemoRecord.objects.bulk_update(
                    rows, ["output", "migrated_at", "migrated_by_key", "migrations"]
                )
                batch.end, batch.migrated = start + len(rows), len(rows)
                batch.save(update_fields=["end", "migrated"])
            return BatchOutcome(start=start, end=batch.end, migrated=batch.migrated)
        except IntegrityError:
            done = DemoBatch.objects.get(key=key)
            return BatchOutcome(
                start=done.start, end=done.end, migrated=done.migrated, replayed=True
            )
        finally:
            _close_in_tool_thread()
