"""The graph rows of LangGraph threads (models/graph.py): a thread's checkpoints, its
tasks' pending writes and its channel values. `sessions_app.langgraph.saver` decides what
to write; this module is where they are written, copied and deleted, beside the Respawn
step and checkpoint of each write (store/writes.py), in the caller's transaction.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import connections
from django.db.models import Q

from agent_runtime.state import SCHEMA_VERSION, StepKind
from agent_runtime.store import Lease

from ..models import AgentSession, Checkpoint, Reason, Step
from ..models.graph import GraphBlob, GraphCheckpoint, GraphThread, GraphWrite
from ..redaction import scrubbed_json
from .writes import filled_state_sql

BATCH = 1000


def ensure_thread(session_id: Any, thread_id: str, *, using: str = "default") -> None:
    """The session's thread row (a graph run by the workers gets one at its first run)."""
    GraphThread.objects.using(using).get_or_create(
        session_id=session_id, defaults={"thread_id": thread_id}
    )


def new_thread(session: AgentSession, thread_id: str, *, using: str = "default") -> None:
    GraphThread.objects.using(using).create(session=session, thread_id=thread_id)


def put_checkpoint(
    *,
    using: str,
    session_id: Any,
    ns: str,
    checkpoint_id: str,
    parent_id: str | None,
    seq: int,
    body: dict[str, Any],
    metadata: dict[str, Any],
    blobs: Sequence[tuple[str, str, str, Any, str | None]],
) -> None:
    """A LangGraph checkpoint at `seq`: its values' new versions (channel, version, type,
    data, base version: a list stored as what was appended to `base`) and its body."""
    if blobs:
        GraphBlob.objects.using(using).bulk_create(
            [
                GraphBlob(
                    session_id=session_id,
                    ns=ns,
                    channel=channel,
                    version=version,
                    type=kind,
                    blob=data,
                    base_version=base,
                )
                for channel, version, kind, data, base in blobs
            ],
            ignore_conflicts=True,
        )
    GraphCheckpoint.objects.using(using).bulk_create(
        [
            GraphCheckpoint(
                session_id=session_id,
                ns=ns,
                checkpoint_id=checkpoint_id,
                parent_id=parent_id,
                seq=seq,
                body=body,
                metadata=metadata,
            )
        ],
        update_conflicts=True,
        unique_fields=["session", "ns", "checkpoint_id"],
        update_fields=["parent_id", "seq", "body", "metadata"],
    )


def put_writes(
    *,
    using: str,
    session_id: Any,
    ns: str,
    checkpoint_id: str,
    task_id: str,
    task_path: str,
    seq: int,
    rows: Iterable[tuple[int, str, str, Any]],
    replace: bool,
) -> None:
    """A task's pending writes (index, channel, type, data) recorded at `seq`. With
    `replace` (errors, interrupts, resumes) the latest one of an index counts; else the
    first."""
    objects = [
        GraphWrite(
            session_id=session_id,
            ns=ns,
            checkpoint_id=checkpoint_id,
            task_id=task_id,
            task_path=task_path,
            idx=idx,
            channel=channel,
            type=kind,
            blob=data,
            seq=seq,
        )
        for idx, channel, kind, data in rows
    ]
    if replace:
        GraphWrite.objects.using(using).bulk_create(
            objects,
            update_conflicts=True,
            unique_fields=["session", "ns", "checkpoint_id", "task_id", "idx"],
            update_fields=["channel", "type", "blob", "seq", "task_path"],
        )
    else:
        GraphWrite.objects.using(using).bulk_create(objects, ignore_conflicts=True)


def delete_checkpoints(session_id: Any, rows: Sequence[Any], *, using: str) -> None:
    """Delete these graph checkpoints of one session, their writes and the Respawn
    checkpoints at their seqs."""
    match = Q()
    for row in rows:
        match |= Q(ns=row.ns, checkpoint_id=row.checkpoint_id)
    GraphWrite.objects.using(using).filter(Q(session_id=session_id) & match).delete()
    Checkpoint.objects.using(using).filter(
        session_id=session_id, seq__in=[r.seq for r in rows]
    ).delete()
    GraphCheckpoint.objects.using(using).filter(id__in=[r.id for r in rows]).delete()


def delete_values_except(session_id: Any, needed: set[int], *, using: str) -> None:
    """Delete the session's channel values but `needed` (a prune's)."""
    GraphBlob.objects.using(using).filter(session_id=session_id).exclude(id__in=needed).delete()


def copy_thread_rows(source_id: Any, target_id: Any, *, using: str) -> None:
    """Every step, checkpoint and graph row of the source session, for the target (a
    thread copied whole: the same seqs)."""
    for model in (Step, Checkpoint, GraphCheckpoint, GraphBlob, GraphWrite):
        rows = model.objects.using(using).filter(session_id=source_id)
        _copy_all(model, rows, using=using, session_id=target_id)


def copy_graph_rows(*, parent: AgentSession, fork: AgentSession, seq_map: dict[int, int]) -> None:
    """The graph side of a fork at checkpoint K: the thread's checkpoints and writes whose
    steps the fork copied (renumbered by `seq_map`), and the values they need. K's own
    pending writes were made after K and stay behind: its tasks run again in the fork."""
    new_thread(fork, str(fork.id))
    for model in (GraphCheckpoint, GraphWrite):
        rows = model.objects.filter(session=parent, seq__in=list(seq_map))
        _copy_all(model, rows, using="default", session_id=fork.pk, seq_map=seq_map)
    _copy_all(
        GraphBlob, GraphBlob.objects.filter(session=parent), using="default", session_id=fork.pk
    )


def _copy_all(
    model: Any,
    rows: Any,
    *,
    using: str,
    session_id: Any,
    seq_map: dict[int, int] | None = None,
) -> None:
    """New rows of `model` with `rows`' values but their ids, for `session_id` (and seqs
    renumbered by `seq_map`), in batches."""
    fields = [f for f in model._meta.concrete_fields if not f.primary_key and f.name != "session"]
    batch = []
    for row in rows.iterator(chunk_size=BATCH):
        values = {f.attname: getattr(row, f.attname) for f in fields}
        if seq_map is not None:
            values["seq"] = seq_map[row.seq]
        batch.append(model(session_id=session_id, **values))
        if len(batch) >= BATCH:
            model.objects.using(using).bulk_create(batch)
            batch = []
    if batch:
        model.objects.using(using).bulk_create(batch)


# --- A saver's write in one statement (PostgreSQL) ------------------------------------------


@dataclass(frozen=True)
class CheckpointRows:
    """What a saver's `put` writes beside its step: the Respawn checkpoint's state, as
    `redaction.fillable_json` gives it for writes.FILLED_FROM_THE_ROW (its agent and step
    count are filled in from the session row the fence advanced: a state stored sealed is
    not written this way), and the graph checkpoint with its new values (as
    `put_checkpoint` takes them)."""

    state: tuple[str, Sequence[str]]
    ns: str
    checkpoint_id: str
    parent_id: str | None
    body: dict[str, Any]
    metadata: dict[str, Any]
    blobs: Sequence[tuple[str, str, str, Any, str | None]]


def _json_column(value: Any) -> str:
    """A column's value in the JSON of a row: text PostgreSQL reads back exactly."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID | Decimal):
        return str(value)
    raise TypeError(f"no JSON for a column value of type {type(value).__name__}")


@dataclass(frozen=True)
class NewThread:
    """A new thread's session row as its first write inserts it, and its thread id."""

    session: AgentSession
    thread_id: str


@dataclass(frozen=True)
class WriteRows:
    """What a saver's `put_writes` writes beside its step (as `put_writes` takes it)."""

    ns: str
    checkpoint_id: str
    task_id: str
    task_path: str
    rows: Sequence[tuple[int, str, str, Any]]
    replace: bool


def fenced_write(
    lease: Lease,
    *,
    using: str,
    head: bool,
    lease_ttl: float | None,
    final_answer: str | None,
    payload: dict[str, Any],
    renew_within: float | None = None,
    now: datetime,
    checkpoint: CheckpointRows | None = None,
    writes: WriteRows | None = None,
    create: NewThread | None = None,
) -> tuple[int, bool] | None:
    """One write of a LangGraph saver on PostgreSQL, in one statement (one round trip, one
    commit outside a transaction): `advance_held`'s fenced UPDATE of the session row, the
    `system` step at the seq it returns, and the checkpoint (a Respawn checkpoint and the
    graph rows) or the task's writes. When the lease no longer holds, the UPDATE returns no
    row, the INSERTs select nothing and None is returned: nothing was written. Else (the
    new seq, whether a cancel was requested). With `lease_ttl`, the lease's expiry moves to
    `lease_ttl` seconds from now when less than `renew_within` seconds are left of it
    (every write, without `renew_within`): now on the database's clock, as every lease's.

    With `create`, a new thread's first write: its session row is inserted as `create`
    has it (already holding `lease`, at seq 1) with its thread row, instead of advanced;
    when the session is there already, nothing is written and None is returned."""
    from .postgresql import SESSION_FIELDS, _execute_prepared

    connection = connections[using]
    session_id = str(lease.session_id)
    if create is not None:
        table = AgentSession._meta.db_table
        # The row as one JSON object (one parameter, not one per column), each column
        # through its field as Django's INSERT sends it (scrubbed text too).
        # The row holds `lease` from its first write: its holder and token are the lease's.
        create.session.lease_owner = lease.owner
        create.session.fencing_token = lease.token
        row = {
            f.column: f.get_db_prep_save(f.pre_save(create.session, True), connection)
            for f in AgentSession._meta.concrete_fields
        }
        columns = [connection.ops.quote_name(column) for column in row]
        # The lease's expiry on the database's clock, as every lease's.
        values = [
            "statement_timestamp() + make_interval(secs => %s::float8)"
            if column == "lease_expires_at"
            else f"r.{quoted}"
            for column, quoted in zip(row, columns, strict=True)
        ]
        sql = [
            f"WITH fenced AS (INSERT INTO {table} ({', '.join(columns)}) SELECT"
            f" {', '.join(values)} FROM jsonb_populate_record(NULL::{table}, %s::jsonb) AS r"
            " ON CONFLICT (id) DO NOTHING"
            " RETURNING last_seq, cancel_requested, agent, agent_version)",
            f", new_thread AS (INSERT INTO {GraphThread._meta.db_table} (session_id, thread_id)"
            " SELECT %s::uuid, %s::text FROM fenced)",
        ]
        params: list[Any] = [lease_ttl or 0.0, json.dumps(row, default=_json_column)]
        params += [session_id, create.thread_id]
    else:
        if final_answer is not None:  # through the field: scrubbed as every other write
            final_answer = SESSION_FIELDS["final_answer"].get_db_prep_save(final_answer, connection)
        # updated_at and lease_expires_at are in the session table's indexes: writing them
        # on every step would make every UPDATE a non-HOT one that adds an entry to each
        # index. updated_at moves at most once a second (as a worker's append moves it),
        # the lease's expiry once less than `renew_within` is left of it.
        ttl = lease_ttl or 0.0
        renew = ttl if renew_within is None else renew_within
        params = [head, lease_ttl is not None, renew, ttl]
        params += [final_answer, now - timedelta(seconds=1), now]
        params += [session_id, lease.token, lease.owner]
        sql = [
            f"WITH fenced AS (UPDATE {AgentSession._meta.db_table}"
            " SET last_seq = last_seq + 1, step_count = step_count + 1,"
            " head = CASE WHEN %s::boolean THEN last_seq + 1 ELSE head END,"
            " lease_expires_at = CASE WHEN %s::boolean AND (lease_expires_at IS NULL"
            " OR lease_expires_at < statement_timestamp() + make_interval(secs => %s::float8))"
            " THEN statement_timestamp() + make_interval(secs => %s::float8)"
            " ELSE lease_expires_at END,"
            " final_answer = COALESCE(%s::text, final_answer),"
            " updated_at = CASE WHEN updated_at < %s::timestamptz THEN %s::timestamptz"
            " ELSE updated_at END"
            " WHERE id = %s::uuid AND fencing_token = %s AND lease_owner = %s"
            " RETURNING last_seq, cancel_requested, agent, agent_version)",
        ]
    sql += [
        f", new_step AS (INSERT INTO {Step._meta.db_table} (session_id, seq, kind, payload,"
        " schema_version, started_at, finished_at, tokens_in, tokens_out, created_at)"
        " SELECT %s::uuid, fenced.last_seq, %s::varchar, %s::jsonb, %s, %s::timestamptz,"
        " %s::timestamptz, 0, 0, %s::timestamptz FROM fenced)",
    ]
    params += [session_id, StepKind.SYSTEM.value, scrubbed_json(payload), SCHEMA_VERSION]
    params += [now, now, now]
    if checkpoint is not None:
        sql.append(
            f", new_checkpoint AS (INSERT INTO {Checkpoint._meta.db_table} (session_id, seq,"
            " state, schema_version, reason, created_at)"
            " SELECT %s::uuid, fenced.last_seq, "
            + filled_state_sql("fenced", "COALESCE(fenced.agent_version, '')")
            + ", %s, %s::varchar, %s::timestamptz FROM fenced)"
        )
        text, (name, version, steps) = checkpoint.state
        params += [session_id, text, name, version, steps, SCHEMA_VERSION, Reason.AUTO]
        params.append(now)
        if checkpoint.blobs:
            # Rows as arrays: one statement text (prepared once) whatever their number.
            sql.append(
                f", new_values AS (INSERT INTO {GraphBlob._meta.db_table} (session_id, ns,"
                " channel, version, type, blob, base_version)"
                " SELECT %s::uuid, %s::text, v.channel, v.version, v.type, v.blob, v.base"
                " FROM fenced, unnest(%s::text[], %s::text[], %s::text[], %s::bytea[],"
                " %s::text[]) AS v (channel, version, type, blob, base)"
                " ON CONFLICT (session_id, ns, channel, version) DO NOTHING)"
            )
            params += [session_id, checkpoint.ns]
            params += [list(column) for column in zip(*checkpoint.blobs, strict=True)]
        sql.append(
            f", graph_checkpoint AS (INSERT INTO {GraphCheckpoint._meta.db_table} (session_id,"
            " ns, checkpoint_id, parent_id, seq, body, metadata)"
            " SELECT %s::uuid, %s::text, %s::text, %s::text, fenced.last_seq, %s::jsonb,"
            " %s::jsonb FROM fenced"
            " ON CONFLICT (session_id, ns, checkpoint_id) DO UPDATE SET"
            " parent_id = EXCLUDED.parent_id, seq = EXCLUDED.seq, body = EXCLUDED.body,"
            " metadata = EXCLUDED.metadata)"
        )
        params += [session_id, checkpoint.ns, checkpoint.checkpoint_id, checkpoint.parent_id]
        params += [json.dumps(checkpoint.body), json.dumps(checkpoint.metadata)]
    if writes is not None and writes.rows:
        conflict = (
            " DO UPDATE SET channel = EXCLUDED.channel, type = EXCLUDED.type,"
            " blob = EXCLUDED.blob, seq = EXCLUDED.seq, task_path = EXCLUDED.task_path"
            if writes.replace
            else " DO NOTHING"
        )
        sql.append(
            f", new_writes AS (INSERT INTO {GraphWrite._meta.db_table} (session_id, ns,"
            " checkpoint_id, task_id, task_path, idx, channel, type, blob, seq)"
            " SELECT %s::uuid, %s::text, %s::text, %s::text, %s::text, v.idx, v.channel,"
            " v.type, v.blob, fenced.last_seq FROM fenced, unnest(%s::integer[], %s::text[],"
            " %s::text[], %s::bytea[]) AS v (idx, channel, type, blob)"
            " ON CONFLICT (session_id, ns, checkpoint_id, task_id, idx)" + conflict + ")"
        )
        params += [session_id, writes.ns, writes.checkpoint_id, writes.task_id]
        params.append(writes.task_path)
        params += [list(column) for column in zip(*writes.rows, strict=True)]
    sql.append(" SELECT last_seq, cancel_requested FROM fenced")
    fenced = _execute_prepared("".join(sql), params, using=using)
    return None if fenced is None else (fenced[0], bool(fenced[1]))
