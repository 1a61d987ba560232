"""The Django implementation of agent_runtime's SessionStore.

Every write is one transaction that starts with a conditional UPDATE of the session row on
(id, fencing_token, lease_owner): a worker whose lease was taken over or fenced off by an
operator action matches no row and writes nothing.

Every blob read goes through agent_runtime.upgraders; a blob this code cannot load raises
IncompatibleSchemaError naming the checkpoint or step, before anything is written.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import Case, F, Value, When
from django.utils import timezone

from agent_runtime.records import BatchOutcome, demo_record, migrate_payload
from agent_runtime.state import (
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
)
from agent_runtime.upgraders import IncompatibleSchemaError, load_state, load_step_payload

from .models import (
    RUNNABLE,
    AgentSession,
    Checkpoint,
    DemoBatch,
    DemoRecord,
    SideEffect,
    Status,
    Step,
)

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


class DjangoSessionStore:
    def claim(self, session_id: str, owner: str, ttl: float) -> Lease | None:
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
        # Only the columns a load needs: `check_state_compat` runs this with the next
        # release's code before that release's migrations, when newer columns don't exist.
        try:
            session = AgentSession.objects.only("id", "agent", "status", "head", "last_seq").get(
                id=session_id
            )
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
        count = len(steps)
        now = timezone.now()
        changes: dict[str, Any] = {
            "last_seq": F("last_seq") + count,
            "step_count": F("step_count") + count,
            "tokens_in": F("tokens_in") + sum(s.tokens_in for s in steps),
            "tokens_out": F("tokens_out") + sum(s.tokens_out for s in steps),
            "updated_at": now,
            # A lease holder writes only after its load_head succeeded: whatever code marked
            # the session incompatible before, this code loads it.
            "incompatible_reason": "",
            "incompatible_at": None,
            "incompatible_code_schema": None,
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

    def thread_cleanup(self) -> None:
        """Close the calling thread's connections (the heartbeat thread's, when it ends)."""
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
            # Tools run on short-lived threads (for their timeout); their connections
            # would otherwise outlive them.
            if threading.current_thread() is not threading.main_thread():
                connections.close_all()


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
            if threading.current_thread() is not threading.main_thread():
                connections.close_all()
