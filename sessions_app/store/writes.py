"""Writes of the trace outside a worker's append: the one place besides the dialects'
append that writes step and checkpoint rows or moves a session's fence.

Who writes here: an operator's step (services), a session born with steps (a start, a fork,
an import), a rollback's supersede and its copy of the head, the admin's edit of a step or a
checkpoint, the OpenAI Agents SDK session's items and the LangGraph saver's steps (each a
program writing under its own lease), retention's deletes. Graph rows are store/graph.py's.

Every function here works on a session row its caller locked (`select_for_update`) in the
transaction it writes in, and changes the row's counters on the instance: the caller saves
it (with its own status, error and answer) before the transaction commits. The fence is
written once, in `fence`: whoever held the lease is fenced off, so a late write of theirs
matches no row (the dialects' append checks token and owner) and lands nowhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import Q, QuerySet
from django.db.models.functions import Now
from django.utils import timezone

from agent_runtime.state import SCHEMA_VERSION
from agent_runtime.store import Lease

from ..fields import READABLE_FROM, READABLE_UNTIL
from ..models import AgentSession, Checkpoint, ImportedAuditRecord, Reason, SessionNote, Step

# The session columns the fence moves.
FENCE_FIELDS = ["fencing_token", "lease_owner", "lease_expires_at"]


def fence(
    session: AgentSession, *, owner: str | None = None, expires: datetime | None = None
) -> tuple[int, int]:
    """Move the session's fencing token on and give its lease to `owner` (None: to
    nobody). Whoever held it before can write nothing more. Returns (token before, after)."""
    before = session.fencing_token
    session.fencing_token = before + 1
    session.lease_owner = owner
    session.lease_expires_at = expires if owner is not None else None
    return before, session.fencing_token


def holds(session: AgentSession, lease: Lease) -> bool:
    """Whether `lease` still holds the (locked) session: its token and owner."""
    return session.fencing_token == lease.token and session.lease_owner == lease.owner


def fence_now(session: AgentSession, *, using: str = "default") -> tuple[int, int]:
    """`fence` and save just the fence (an edit that changes nothing else on the row)."""
    moved = fence(session)
    session.save(using=using, update_fields=FENCE_FIELDS)
    return moved


def take_lease(session: AgentSession, owner: str, ttl: float, *, using: str = "default") -> Lease:
    """A program's writer (a LangGraph saver) takes the session's lease: fenced, saved;
    it expires `ttl` seconds from now on the database's clock, as every lease (a program's
    own clock may be off). The instance's `lease_expires_at` is not read back."""
    fence(session, owner=owner)
    AgentSession.objects.using(using).filter(pk=session.pk).update(
        fencing_token=session.fencing_token,
        lease_owner=owner,
        lease_expires_at=Now() + timedelta(seconds=ttl),
    )
    return Lease(str(session.id), owner, session.fencing_token)


def expire_lease(session_id: Any, *, ago: timedelta) -> None:
    """Make a held lease look like its holder died `ago` (the demo's stuck session)."""
    AgentSession.objects.filter(id=session_id).update(lease_expires_at=timezone.now() - ago)


def advance_held(
    lease: Lease,
    *,
    using: str = "default",
    head: bool,
    expires: datetime | None,
    final_answer: str | None = None,
) -> tuple[int, bool, str, str] | None:
    """For one step of a program's writer: advance the session's seq (and its head, with
    `head`; its lease's expiry, with `expires`; its final answer, with `final_answer`)
    only while `lease` holds it, in the caller's transaction. Returns (the new seq, cancel
    requested, agent, agent version), or None when the lease no longer holds (nothing was
    changed)."""
    table = AgentSession._meta.db_table
    connection = connections[using]
    session_id: Any = _uuid(lease.session_id, connection.vendor)
    now = timezone.now()
    if final_answer is not None:  # through the field: scrubbed as every other write of it
        answer_field = AgentSession._meta.get_field("final_answer")
        final_answer = answer_field.get_db_prep_save(final_answer, connection)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET last_seq = last_seq + 1, step_count = step_count + 1,"
            " head = CASE WHEN %s THEN last_seq + 1 ELSE head END,"
            " lease_expires_at = CASE WHEN %s THEN %s ELSE lease_expires_at END,"
            " final_answer = COALESCE(%s, final_answer), updated_at = %s"
            " WHERE id = %s AND fencing_token = %s AND lease_owner = %s"
            " RETURNING last_seq, cancel_requested, agent, agent_version",
            [
                head,
                expires is not None,
                expires,
                final_answer,
                now,
                session_id,
                lease.token,
                lease.owner,
            ],
        )
        row = cursor.fetchone()
    return None if row is None else (row[0], bool(row[1]), row[2], row[3])


# A program's write moves a session's updated_at at most once in this long (it is in three
# indexes: moving it on every write makes every UPDATE a non-HOT one); a status change
# always moves it.
PROGRAM_ACTIVITY_EVERY = timedelta(seconds=1)


# What a checkpoint state written in one statement with its step (a program's, a LangGraph
# saver's) takes from the session row that statement advances.
FILLED_FROM_THE_ROW = (("agent", "name"), ("agent", "version"), ("counters", "steps"))


def filled_state_sql(row: str, version: str) -> str:
    """The SQL of a checkpoint state as `redaction.fillable_json` gives it for
    FILLED_FROM_THE_ROW, its markers replaced by what `row` (the statement's CTE of the
    advanced session row) holds: its agent, `version` (SQL), and its last seq. Its
    parameters: the text, then each marker in order (and any `version` takes before the
    last)."""
    return (
        "replace(replace(replace(%s::text,"
        f" %s, to_json(COALESCE({row}.agent, '')::text)::text),"
        f" %s, to_json(({version})::text)::text),"
        f" %s, {row}.last_seq::text)::json"
    )


def append_program(
    session_id: Any,
    rows: Sequence[NewRow],
    *,
    lease: Lease | None,
    runnable: Sequence[str],
    checkpoint: dict[str, Any] | None,
    agent_version: str = "",
    final_answer: str | None = None,
    status: str | None = None,
) -> int | None:
    """A program's write of `rows` (an SDK session's items) in one statement, on the default
    database, in the caller's transaction: the session row advanced by their count (its
    head too, and its final answer and status when given) only while the writer may write,
    the steps numbered after the seq it had, and `checkpoint` (a state, when given) at the
    new last seq, its agent name, version and step count filled in from the row
    (`agent_version`, when given, is the version instead).

    With `lease`: while the lease holds the session. Without: while no lease is held, the
    status is none of `runnable`, and its head checkpoint waits for no person's decision.
    Returns the new last seq, or None when the write may not go ahead this way (nothing
    was written): the caller then locks the row and finds out why (or creates it), and
    writes a checkpoint stored sealed (a secret in it) with its values known.
    PostgreSQL only: None on other databases."""
    from django.db import connection

    from ..redaction import fillable_json, scrubbed_json
    from .postgresql import _execute_prepared

    if connection.vendor != "postgresql" or not rows:
        return None
    state: tuple[str, list[str]] | None = None
    if checkpoint is not None:
        # The statement fills the state's agent and step count in; a state stored sealed
        # (a secret in it) keeps its exact copy out of reach: the caller's locked path
        # writes it with them known.
        state = fillable_json(checkpoint, FILLED_FROM_THE_ROW)
        if state is None:
            return None
    table = AgentSession._meta.db_table
    now = timezone.now()
    count = len(rows)
    if final_answer is not None:  # through the field: scrubbed as every other write of it
        answer_field = AgentSession._meta.get_field("final_answer")
        final_answer = answer_field.get_db_prep_save(final_answer, connection)
    sets = [
        "last_seq = last_seq + %s",
        "step_count = step_count + %s",
        "head = CASE WHEN %s THEN last_seq + %s ELSE head END",
        "final_answer = COALESCE(%s, final_answer)",
        "status = COALESCE(%s, status)",
        "updated_at = CASE WHEN updated_at < %s OR status <> COALESCE(%s, status) THEN %s"
        " ELSE updated_at END",
    ]
    params: list[Any] = [count, count, checkpoint is not None, count, final_answer, status]
    params += [now - PROGRAM_ACTIVITY_EVERY, status, now]
    if lease is not None:
        condition = "fencing_token = %s AND lease_owner = %s"
        params += [str(session_id), lease.token, lease.owner]
    else:
        condition = (
            "lease_owner IS NULL AND NOT (status = ANY(%s)) AND (status <> 'waiting_input' OR"
            " COALESCE((SELECT c.state -> 'pending_approval' ->> 'call_id'"
            f" FROM {Checkpoint._meta.db_table} c WHERE c.session_id = {table}.id"
            f" AND c.seq = {table}.head ORDER BY c.id DESC LIMIT 1), '') = '')"
        )
        params += [str(session_id), list(runnable)]
    values = []
    select_params: list[Any] = [str(session_id), count, now]
    for index, row in enumerate(rows):
        values.append("(%s, %s::varchar, %s::jsonb, %s::smallint)")
        select_params += [index + 1, row.kind, scrubbed_json(row.payload), row.schema_version]
    sql = [
        f"WITH advanced AS (UPDATE {table} SET {', '.join(sets)}"
        f" WHERE id = %s::uuid AND {condition}"
        " RETURNING last_seq, agent, agent_version)",
        f", new_steps AS (INSERT INTO {Step._meta.db_table} (session_id, seq, kind, payload,"
        " schema_version, started_at, finished_at, tokens_in, tokens_out, created_at)"
        " SELECT %s::uuid, advanced.last_seq - %s + v.n, v.kind, v.payload, v.schema_version,"
        " t.now, t.now, 0, 0, t.now"
        " FROM advanced, (SELECT %s::timestamptz AS now) AS t,"
        f" (VALUES {', '.join(values)}) AS v (n, kind, payload, schema_version))",
    ]
    params += select_params
    if state is not None:
        text, (name, version, steps) = state
        sql.append(
            f", new_checkpoint AS (INSERT INTO {Checkpoint._meta.db_table} (session_id, seq,"
            " state, schema_version, reason, created_at)"
            " SELECT %s::uuid, advanced.last_seq, "
            + filled_state_sql(
                "advanced", "COALESCE(NULLIF(%s::text, ''), advanced.agent_version, '')"
            )
            + ", %s, %s, %s::timestamptz FROM advanced)"
        )
        params += [str(session_id), text, name, version, agent_version, steps]
        params += [SCHEMA_VERSION, Reason.AUTO, now]
    sql.append(" SELECT last_seq FROM advanced")
    advanced = _execute_prepared("".join(sql), params)
    return None if advanced is None else int(advanced[0])


def _pk(session: AgentSession | Any) -> Any:
    return session.pk if isinstance(session, AgentSession) else session


def _uuid(value: Any, vendor: str) -> Any:
    import uuid

    as_uuid = uuid.UUID(str(value))
    return as_uuid if vendor == "postgresql" else as_uuid.hex


# --- Steps ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class NewRow:
    """A step written outside a run. A copied step (a fork's) keeps its schema version,
    times, tokens and idempotency key; a new one has this code's version and `now`."""

    kind: str
    payload: dict[str, Any]
    schema_version: int = SCHEMA_VERSION
    started_at: datetime | None = None
    finished_at: datetime | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    idempotency_key: str | None = None

    @classmethod
    def copy_of(cls, step: Step) -> NewRow:
        return cls(
            kind=step.kind,
            payload=step.payload,
            schema_version=step.schema_version,
            started_at=step.started_at,
            finished_at=step.finished_at,
            tokens_in=step.tokens_in,
            tokens_out=step.tokens_out,
            idempotency_key=step.idempotency_key,
        )


def add_steps(
    session: AgentSession | Any,
    rows: Sequence[NewRow],
    *,
    using: str = "default",
    now: datetime | None = None,
    seq: int | None = None,
) -> list[int]:
    """Write `rows` after the session's last seq, counting them on the (locked) instance;
    or from `seq` on, for a program's writer whose `advance_held` already moved the row
    (then `session` may be its id). Returns their seqs."""
    now = now or timezone.now()
    first = session.last_seq + 1 if seq is None else seq
    Step.objects.using(using).bulk_create(
        [
            Step(
                session_id=_pk(session),
                seq=first + index,
                kind=row.kind,
                payload=row.payload,
                schema_version=row.schema_version,
                started_at=row.started_at or now,
                finished_at=row.finished_at or now,
                tokens_in=row.tokens_in,
                tokens_out=row.tokens_out,
                idempotency_key=row.idempotency_key,
                created_at=now,
            )
            for index, row in enumerate(rows)
        ]
    )
    if seq is None:
        session.last_seq += len(rows)
        session.step_count += len(rows)
        session.tokens_in += sum(r.tokens_in for r in rows)
        session.tokens_out += sum(r.tokens_out for r in rows)
        session.updated_at = now
    return list(range(first, first + len(rows)))


def add_step(session: AgentSession, kind: str, payload: dict[str, Any], **options: Any) -> int:
    """One step (add_steps' options); returns its seq."""
    tokens = {k: options.pop(k) for k in ("tokens_in", "tokens_out") if k in options}
    return add_steps(session, [NewRow(kind, payload, **tokens)], **options)[0]


def append_operator_step(session: AgentSession, kind: str, payload: dict[str, Any]) -> int:
    """A step a person's action writes outside any run. It fences: whoever held the lease
    is fenced off, so no late write can land after a person's decision."""
    fence(session)
    return add_step(session, kind, payload)


def new_session(rows: Sequence[NewRow], *, now: datetime, **fields: Any) -> AgentSession:
    """A session born with `rows`, numbered from 1 in order (a start, a fork)."""
    session = AgentSession.objects.create(created_at=now, updated_at=now, **fields)
    add_steps(session, rows, now=now)
    session.save(update_fields=["last_seq", "step_count", "tokens_in", "tokens_out"])
    return session


def supersede(steps: QuerySet[Step], *, now: datetime | None = None) -> int:
    """Mark live steps superseded (never deleted): a rollback's, a program's pop or clear."""
    return steps.filter(superseded_at__isnull=True).update(superseded_at=now or timezone.now())


def supersede_after(session: AgentSession, seq: int, *, now: datetime) -> int:
    """A rollback to checkpoint `seq`: every live step after it is superseded."""
    return supersede(Step.objects.filter(session=session, seq__gt=seq), now=now)


def edit_step_payload(step: Step, payload: dict[str, Any]) -> None:
    """The admin's fix of a step by hand (checked and audited by the service)."""
    step.payload = payload
    step.save(update_fields=["payload"])


# --- Checkpoints ---------------------------------------------------------------------------


def add_checkpoint(
    session: AgentSession | Any,
    state: dict[str, Any],
    *,
    seq: int | None = None,
    reason: str = Reason.AUTO,
    schema_version: int = SCHEMA_VERSION,
    using: str = "default",
    now: datetime | None = None,
) -> Checkpoint:
    """A checkpoint at `seq` (the session's last seq when None; give it when `session` is
    an id). A copied state keeps the schema version it was stored in."""
    return Checkpoint.objects.using(using).create(
        session_id=_pk(session),
        seq=session.last_seq if seq is None else seq,
        state=state,
        schema_version=schema_version,
        reason=reason,
        created_at=now or timezone.now(),
    )


def edit_checkpoint_state(checkpoint: Checkpoint, state: dict[str, Any]) -> None:
    """The admin's fix of a checkpoint by hand (checked and audited by the service)."""
    checkpoint.state = state
    checkpoint.save(update_fields=["state"])


# --- Imports and retention -----------------------------------------------------------------


def insert_imported(
    session: AgentSession,
    steps: Iterable[dict[str, Any]],
    checkpoints: Iterable[dict[str, Any]],
    events: Iterable[dict[str, Any]],
) -> tuple[int, int, int]:
    """An imported session, its steps, checkpoints and the file's audit records (kept
    apart, as imported history), as the file has them (checked and upgraded by the
    importer); in the caller's transaction."""
    session.save(force_insert=True)
    step_rows = [Step(session_id=session.pk, **row) for row in steps]
    checkpoint_rows = [Checkpoint(session_id=session.pk, **row) for row in checkpoints]
    event_rows = [ImportedAuditRecord(session_id=session.pk, **row) for row in events]
    with transaction.atomic():
        Step.objects.bulk_create(step_rows, batch_size=500)
        Checkpoint.objects.bulk_create(checkpoint_rows, batch_size=500)
        ImportedAuditRecord.objects.bulk_create(event_rows, batch_size=500)
    return len(step_rows), len(checkpoint_rows), len(event_rows)


def repair_times(session_id: Any, now: datetime) -> dict[str, int]:
    """Move every time of the session's row, steps and checkpoints that lies outside what
    Python (and so any page) can read to `now`; in the caller's transaction. Returns how
    many values of each column moved, by "table.column"."""
    moved: dict[str, int] = {}
    for model, key in ((AgentSession, "id"), (Step, "session_id"), (Checkpoint, "session_id")):
        for f in model._meta.concrete_fields:
            if f.get_internal_type() != "DateTimeField":
                continue
            outside = Q(**{f"{f.name}__gt": READABLE_UNTIL}) | Q(**{f"{f.name}__lt": READABLE_FROM})
            count = model.objects.filter(outside, **{key: session_id}).update(**{f.name: now})
            if count:
                moved[f"{model._meta.model_name}.{f.name}"] = count
    return moved


def delete_trace(session_ids: Sequence[Any]) -> None:
    """Retention's delete of whole sessions: their steps, checkpoints, imported history
    and people's notes (the caller deletes the rest), without loading them."""
    Step.objects.filter(session_id__in=session_ids)._raw_delete(Step.objects.db)
    Checkpoint.objects.filter(session_id__in=session_ids)._raw_delete(Checkpoint.objects.db)
    ImportedAuditRecord.objects.filter(session_id__in=session_ids)._raw_delete(
        ImportedAuditRecord.objects.db
    )
    SessionNote.objects.filter(session_id__in=session_ids)._raw_delete(SessionNote.objects.db)


def drop_rows(rows: QuerySet[Any]) -> None:
    """Retention's delete of some steps or checkpoints (thinning, compaction)."""
    if rows.model not in (Step, Checkpoint):
        raise TypeError(f"drop_rows deletes steps or checkpoints, not {rows.model.__name__}")
    rows._raw_delete(rows.db)


def release(session: AgentSession) -> None:
    """Let the session's lease go (its token stays: nothing was fenced off)."""
    session.lease_owner = None
    session.lease_expires_at = None
