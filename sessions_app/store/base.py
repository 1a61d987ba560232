"""The Django implementation of agent_runtime's SessionStore.

Every write is one transaction that starts with a conditional UPDATE of the session row on
(id, fencing_token, lease_owner): a worker whose lease was taken over or fenced off by an
operator action matches no row and writes nothing.

One class per dialect, chosen by the default connection's vendor in one factory,
`sessions_app.store.session_store()`: PostgreSQLSessionStore (store/postgresql.py), where an
append is a single statement, so a durable step costs one round trip and one commit, and
PortableSessionStore (store/portable.py), the ORM path SQLite takes in `make run`. The rules
both follow live here, in the abstract DjangoSessionStore: what an append writes on the
session row and in the step and checkpoint rows (AppendRows), the fence, how a load reads
rows into the engine's records, failed-call counting and branch results.

Every blob read goes through agent_runtime.upgraders; a blob this code cannot load raises
IncompatibleSchemaError naming the checkpoint or step, before anything is written.
"""

from __future__ import annotations

import abc
import contextlib
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, NamedTuple

from django.db import IntegrityError, connection, connections, transaction
from django.db.models import F, Field, Q, QuerySet
from django.db.models.functions import Now
from django.db.models.signals import post_migrate, pre_migrate
from django.dispatch import receiver
from django.utils import timezone

from agent_runtime.records import BatchOutcome, demo_record, migrate_payload
from agent_runtime.state import (
    CheckpointReason,
    CheckpointRecord,
    NewCheckpoint,
    NewStep,
    OperatorAction,
    PayloadField,
    SessionStatus,
    StepKind,
    StepRecord,
    as_model,
    usage_cost,
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
)
from agent_runtime.upgraders import IncompatibleSchemaError, load_state, load_step_payload

from ..models import (
    AgentSession,
    AlertReason,
    AuditAction,
    AuditEvent,
    DemoBatch,
    DemoRecord,
    SideEffect,
    Step,
    payload_key,
    payload_q,
)
from ..sealing import exact
from .alerts import append_reason, raise_alert, rules_exist

# How stale a running session's updated_at may get between two of its steps.
UPDATED_AT_RESOLUTION = timedelta(seconds=1)

# Per database (alias and name): the session table's columns, once it has every column
# this code knows. The deploy gate (check_state_compat) loads sessions with the next
# release's code before that release's migrations ran, when the newest ones (agent_version,
# compacted_steps) do not exist yet. Forgotten whenever migrations run.
_SESSION_COLUMNS: dict[tuple[str, str], set[str]] = {}

# The session columns a load reads that such a database may not have yet (SessionRow's
# defaults stand in for those it does not have).
NEWER_SESSION_COLUMNS = ("agent_version", "compacted_steps", "deadline_at")


@receiver(pre_migrate)
@receiver(post_migrate)
def _schema_may_have_changed(**kwargs: Any) -> None:
    _SESSION_COLUMNS.clear()


def _session_has(column: str) -> bool:
    key = (connection.alias, str(connection.settings_dict.get("NAME")))
    columns = _SESSION_COLUMNS.get(key)
    if columns is None:
        with connection.cursor() as cursor:
            description = connection.introspection.get_table_description(
                cursor, AgentSession._meta.db_table
            )
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
        model = as_model(step.payload)
        usage = model.get("usage") or {}
        row = by_model.setdefault(
            str(model.get("model") or "")[:200], [0, 0, 0, 0, 0, Decimal(0), 0]
        )
        row[0] += 1
        row[1] += step.tokens_in
        row[2] += step.tokens_out
        row[3] += int(usage.get("cache_read_tokens") or 0)
        row[4] += int(usage.get("cache_write_tokens") or 0)
        row[5] += Decimal(str(usage_cost(step.payload)))
        row[6] += 1 if usage.get("unpriced") else 0
    return [(model, *row) for model, row in by_model.items()]


class StepRow(NamedTuple):
    """A new step's row, less what the append numbers or shares: session, seq, schema
    version (this code's) and created_at (the append's time)."""

    kind: str
    payload: dict[str, Any]
    started_at: datetime | None
    finished_at: datetime
    tokens_in: int
    tokens_out: int
    idempotency_key: str | None


class CheckpointRow(NamedTuple):
    """A new checkpoint's row, less session, seq (the append's last, which becomes the
    session's head), schema version and created_at, as for a step."""

    state: dict[str, Any]
    reason: str


@dataclass(frozen=True)
class AppendRows:
    """What one append writes, decided once for both dialects."""

    now: datetime
    # Session columns the append adds to, and by how much.
    increments: dict[str, int | Decimal]
    # updated_at becomes `now`: always (None: a status change, an error, the end of a
    # run), or else only if it is older than this, so that within a run it moves at most
    # once per UPDATED_AT_RESOLUTION (the PostgreSQL append says why).
    stale_before: datetime | None
    # Session columns the append sets, to these values (before their fields prepare them).
    values: dict[str, Any]
    steps: list[StepRow]
    checkpoint: CheckpointRow | None
    # The day's model usage of the session (model_usage).
    usage: list[tuple[Any, ...]]

    @property
    def count(self) -> int:
        return len(self.steps)


def append_rows(
    steps: Sequence[NewStep],
    checkpoint: NewCheckpoint | None,
    status: SessionStatus | None,
    error: str | None,
    release: bool,
    final_answer: str | None = None,
) -> AppendRows:
    """What an append of `steps` (with a checkpoint, a status, an error, the release of
    the lease, a final answer) writes."""
    now = timezone.now()
    count = len(steps)
    increments: dict[str, int | Decimal] = {
        "last_seq": count,
        "step_count": count,
        "tokens_in": sum(s.tokens_in for s in steps),
        "tokens_out": sum(s.tokens_out for s in steps),
    }
    cost = sum(usage_cost(s.payload) for s in steps)
    if cost:
        increments["cost"] = Decimal(str(cost))
    values: dict[str, Any] = {
        # A lease holder writes only after its load_head succeeded: whatever code marked
        # the session incompatible before, this code loads it.
        "incompatible_reason": "",
        "incompatible_at": None,
        "incompatible_code_schema": None,
        "incompatible_agent_version": "",
    }
    if checkpoint is not None:
        if checkpoint.state.final_answer is not None:
            values["final_answer"] = checkpoint.state.final_answer
        cursor = checkpoint.state.batch_cursor
        if cursor is not None:
            values["progress_done"] = cursor.get("done")
            values["progress_total"] = cursor.get("total")
    if final_answer is not None:
        values["final_answer"] = final_answer
    if status is not None:
        values["status"] = status.value
    if error is not None:
        values["last_error"] = error
    if release:
        values["lease_owner"] = None
        values["lease_expires_at"] = None
    return AppendRows(
        now=now,
        increments=increments,
        stale_before=None
        if status is not None or error is not None or release
        else now - UPDATED_AT_RESOLUTION,
        values=values,
        steps=[
            StepRow(
                kind=step.kind.value,
                payload=step.payload,
                started_at=step.started_at,
                finished_at=step.finished_at or now,
                tokens_in=step.tokens_in,
                tokens_out=step.tokens_out,
                idempotency_key=step.idempotency_key,
            )
            for step in steps
        ],
        checkpoint=None
        if checkpoint is None
        else CheckpointRow(state=checkpoint.state.to_dict(), reason=checkpoint.reason.value),
        usage=model_usage(steps),
    )


class SessionRow(NamedTuple):
    """What a load reads of the session row and its head checkpoint (seq, state, reason;
    None when it has none)."""

    agent: str
    status: str
    last_seq: int
    checkpoint: tuple[int, Any, str] | None
    # NEWER_SESSION_COLUMNS: their defaults until the database has them.
    agent_version: str = ""
    compacted_steps: int = 0
    deadline_at: datetime | None = None


class LiveStep(NamedTuple):
    """A live step's columns, in the order both dialects select them."""

    seq: int
    kind: str
    payload: Any
    schema_version: int
    started_at: datetime | None
    finished_at: datetime | None
    tokens_in: int
    tokens_out: int
    idempotency_key: str | None


class DjangoSessionStore(abc.ABC):
    """The rules both dialects write by. `session_store()` (sessions_app.store) makes the
    default database's dialect; a subclass of a dialect class keeps that dialect."""

    # --- The fence and the row -------------------------------------------------------------

    @staticmethod
    def _held(lease: Lease) -> QuerySet[AgentSession]:
        """The session row while `lease` holds it: what every fenced write matches first."""
        return AgentSession.objects.filter(
            id=lease.session_id, fencing_token=lease.token, lease_owner=lease.owner
        )

    @staticmethod
    def _fenced_off(lease: Lease, consequence: str = "") -> LeaseLost:
        return LeaseLost(
            f"session {lease.session_id}: lease token {lease.token} was fenced off{consequence}"
        )

    @staticmethod
    def _must_exist(session_id: str) -> None:
        if not AgentSession.objects.filter(id=session_id).exists():
            raise SessionNotFound(session_id)

    @staticmethod
    def _newer_columns() -> list[str]:
        """Of NEWER_SESSION_COLUMNS, those the database has."""
        return [column for column in NEWER_SESSION_COLUMNS if _session_has(column)]

    # --- What each dialect writes and reads in its own way --------------------------------

    @abc.abstractmethod
    def claim(self, session_id: str, owner: str, ttl: float) -> Lease | None:
        """Take a free lease (no crash to count) or an expired one (count the takeovers in
        a row with no progress in between: the dead run wrote at most its own run_started
        step)."""
        raise NotImplementedError

    @abc.abstractmethod
    def _append(self, lease: Lease, rows: AppendRows) -> AppendResult:
        """Write `rows` if `lease` still holds the session (else raise LeaseLost), in one
        transaction; the steps are numbered from the session's last seq on."""
        raise NotImplementedError

    @abc.abstractmethod
    def _session_row(self, session_id: str) -> SessionRow:
        """The session's row and its head checkpoint's; SessionNotFound if it has none."""
        raise NotImplementedError

    @abc.abstractmethod
    def _live_step_rows(self, session_id: str, start: int) -> Iterable[Sequence[Any]]:
        """The live steps from seq `start` on, in seq order, as LiveStep's columns."""
        raise NotImplementedError

    @abc.abstractmethod
    def _hold(self, lease: Lease) -> bool:
        """Whether `lease` holds the session, keeping it held until the transaction ends."""
        raise NotImplementedError

    # --- Loads ------------------------------------------------------------------------------

    def load_head(self, session_id: str) -> SessionHead:
        head = self._frame(session_id, self._session_row(session_id))
        history, versions = self._live_steps(session_id, 1)
        return replace(head, history=history, step_versions=versions)

    def load_tail(self, session_id: str) -> SessionHead:
        return tail_of(self.load_head(session_id))

    def load_history(self, session_id: str) -> list[StepRecord]:
        history = self._live_steps(session_id, 1)[0]
        if not history:  # as load_head: nothing of a session that is not there
            self._must_exist(session_id)
        return history

    def _frame(self, session_id: str, row: SessionRow) -> SessionHead:
        """The head without its history: the session row, its head checkpoint upgraded."""
        checkpoint = None
        applied: tuple[str, ...] = ()
        if row.checkpoint is not None:
            seq, state, reason = row.checkpoint
            try:
                loaded = load_state(exact(state))
            except IncompatibleSchemaError as exc:
                raise exc.at(f"checkpoint at seq {seq}") from exc
            applied = loaded.applied
            checkpoint = CheckpointRecord(
                seq=seq,
                state=loaded.value,
                reason=CheckpointReason(reason),
                schema_version=loaded.stored_version,
            )
        return SessionHead(
            session_id=str(session_id),
            agent_name=row.agent,
            status=SessionStatus(row.status),
            head_seq=checkpoint.seq if checkpoint else 0,
            last_seq=row.last_seq,
            checkpoint=checkpoint,
            history=[],
            upgraders_applied=applied,
            agent_version=row.agent_version,
            deadline=row.deadline_at,
        )

    def _live_steps(self, session_id: str, start: int) -> tuple[list[StepRecord], dict[int, int]]:
        """The live steps from seq `start` on, upgraded, and their count by stored version."""
        history = []
        versions: dict[int, int] = {}
        for row in self._live_step_rows(session_id, start):
            seq, kind, payload, version, started, finished, t_in, t_out, key = row
            try:
                loaded = load_step_payload(kind, exact(payload), version)
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

    # --- Writes -----------------------------------------------------------------------------

    def append(
        self,
        lease: Lease,
        steps: Sequence[NewStep],
        *,
        checkpoint: NewCheckpoint | None = None,
        status: SessionStatus | None = None,
        error: str | None = None,
        release: bool = False,
        final_answer: str | None = None,
    ) -> AppendResult:
        for step in steps:
            validate_step_payload(step.kind, step.payload)
        rows = append_rows(steps, checkpoint, status, error, release, final_answer)
        # The alert a status raises is written in the append's transaction (the outbox):
        # committed together or not at all. Only when some rule exists (cached).
        reason = append_reason(status, checkpoint, error)
        alerting = (reason is not None or status == SessionStatus.COMPLETED) and rules_exist()
        if status != SessionStatus.COMPLETED and not alerting:
            return self._append(lease, rows)
        with transaction.atomic():
            result = self._append(lease, rows)
            if status == SessionStatus.COMPLETED:
                if count_failed_calls(lease.session_id) and alerting:
                    raise_alert(lease.session_id, AlertReason.FAILED_CALLS)
            elif reason is not None:
                raise_alert(lease.session_id, reason, detail=error or "")
            return result

    def append_branch_result(
        self, lease: Lease, step: NewStep, *, call_id: str, after_seq: int
    ) -> BranchAppend:
        with transaction.atomic():
            # The row lock orders concurrent branches of one turn: each sees the results
            # committed before it, so one and only one sees the last call answered.
            if not self._held(lease).select_for_update().values_list("id", flat=True):
                raise self._fenced_off(lease)
            live = Step.objects.filter(session__id=lease.session_id, superseded_at__isnull=True)
            model = live.filter(seq=after_seq).values_list("payload", flat=True).first() or {}
            calls = {c["id"] for c in as_model(exact(model)).get("tool_calls") or []}
            answered = (
                set(
                    live.filter(seq__gt=after_seq, kind=StepKind.TOOL_RESULT.value).values_list(
                        payload_key(PayloadField.CALL_ID), flat=True
                    )
                )
                & calls
            )
            if call_id in answered:
                return BranchAppend(seq=None, unanswered=len(calls - answered))
            seq = self.append(lease, [step]).seqs[0]
            return BranchAppend(seq=seq, unanswered=len(calls - answered - {call_id}))

    def heartbeat(self, lease: Lease, ttl: float) -> HeartbeatResult:
        # On the database's clock, as the claim.
        alive = self._held(lease).update(lease_expires_at=Now() + timedelta(seconds=ttl))
        cancel = (
            AgentSession.objects.filter(id=lease.session_id)
            .values_list("cancel_requested", flat=True)
            .first()
        )
        return HeartbeatResult(alive=bool(alive), cancel_requested=bool(cancel))

    def release(self, lease: Lease) -> bool:
        # Also called again and again after the database failed under a run: a connection
        # that failure broke is dropped first, and the next query opens a new one.
        if connection.errors_occurred and not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()
        return bool(self._held(lease).update(lease_owner=None, lease_expires_at=None))

    def came_back(self, lease: Lease) -> bool:
        taken_over = AgentSession.objects.filter(
            id=lease.session_id, fencing_token=lease.token + 1, crash_count__gt=0
        ).exclude(Q(lease_owner=None) | Q(lease_owner=lease.owner))
        return bool(taken_over.update(crash_count=F("crash_count") - 1))

    def report_progress(self, lease: Lease, *, done: int, total: int | None, message: str) -> bool:
        return bool(
            self._held(lease).update(
                progress_done=max(0, done),
                progress_total=None if total is None else max(0, total),
                progress_note=message[:200],
            )
        )

    @contextlib.contextmanager
    def fenced(self, lease: Lease) -> Iterator[None]:
        """One transaction around a tool's writes that first checks the lease's token and
        owner on the session row and holds it until commit: a claim (an UPDATE of that
        row) waits until the writes are in, and writes of a fenced-off run never commit."""
        try:
            with transaction.atomic():
                if not self._hold(lease):
                    raise self._fenced_off(lease, "; the tool's write was refused")
                yield
        finally:
            _close_in_tool_thread()

    def report_late_call(self, lease: Lease, report: dict[str, Any]) -> None:
        """An audit record (the trace is the new holder's), shown on the session's page
        and counted in "needs attention"."""
        try:
            with transaction.atomic():
                AuditEvent.objects.create(
                    actor=None,
                    actor_label=f"worker {report.get('worker') or lease.owner}",
                    action=LATE_CALL_ACTION,
                    session_id=lease.session_id,
                    after=report,
                )
                if rules_exist():
                    raise_alert(
                        lease.session_id,
                        AlertReason.LATE_CALL,
                        detail=str(report.get("tool") or report.get("name") or ""),
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
            payload_q(PayloadField.STATUS, value="error"),
            session_id=session_id,
            kind=StepKind.TOOL_RESULT.value,
            superseded_at__isnull=True,
        ).values_list("seq", payload_key(PayloadField.FAILURE))
        if failure != "rejected"
    }
    if failed:
        corrected = Step.objects.filter(
            payload_q(PayloadField.ACTION, value=OperatorAction.CORRECT_RESULT),
            session_id=session_id,
            kind=StepKind.OPERATOR.value,
            superseded_at__isnull=True,
        ).values_list(payload_key(PayloadField.RESULT_SEQ), flat=True)
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


def _migrate_records(rows: Sequence[tuple[int, Any]], *, key: str, now: datetime) -> None:
    """Write the migrated records (id, payload): one UPDATE per row, sent together
    (executemany), so a batch costs in proportion to its rows (bulk_update's one CASE WHEN
    branch per row took minutes for 10,000); each value through its field, as an ORM
    save sends it (the output scrubbed)."""
    db = connections[DemoRecord.objects.db]
    column = db.ops.quote_name

    def field(name: str) -> Field:
        found = DemoRecord._meta.get_field(name)
        assert isinstance(found, Field)  # a concrete column of the table
        return found

    output, when, by = field("output"), field("migrated_at"), field("migrated_by_key")
    count = column(field("migrations").column)
    sql = (
        f"UPDATE {column(DemoRecord._meta.db_table)} SET {column(output.column)} = %s,"
        f" {column(when.column)} = %s, {column(by.column)} = %s, {count} = {count} + 1"
        f" WHERE {column(DemoRecord._meta.pk.column)} = %s"
    )
    at, by_key = when.get_db_prep_save(now, db), by.get_db_prep_save(key, db)
    values = [
        (output.get_db_prep_save(migrate_payload(payload), db), at, by_key, row_id)
        for row_id, payload in rows
    ]
    if values:
        with db.cursor() as cursor:
            cursor.executemany(sql, values)


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
                rows = list(
                    DemoRecord.objects.select_for_update()
                    .filter(dataset=dataset, number__gt=start, number__lte=start + size)
                    .values_list("id", "payload")
                )
                _migrate_records(rows, key=key, now=timezone.now())
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
