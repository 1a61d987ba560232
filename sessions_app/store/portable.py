"""The session store through the ORM: the path SQLite takes in `make run`. The rules it
writes by are DjangoSessionStore's (sessions_app.store)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Case, F, Value, When
from django.db.models.functions import Now

from agent_runtime.state import SCHEMA_VERSION
from agent_runtime.store import AppendResult, Lease, SessionNotFound

from ..models import RUNNABLE, AgentSession, Checkpoint, ModelUsage, Status, Step
from .base import AppendRows, DjangoSessionStore, LiveStep, SessionRow


class PortableSessionStore(DjangoSessionStore):
    def claim(self, session_id: str, owner: str, ttl: float) -> Lease | None:
        # On the database's clock (Now()), as on PostgreSQL.
        now = Now()
        runnable = AgentSession.objects.filter(id=session_id, status__in=RUNNABLE)
        taken = {
            "lease_owner": owner,
            "lease_expires_at": Now() + timedelta(seconds=ttl),
            "fencing_token": F("fencing_token") + 1,
            "status": Status.RUNNING,
            "updated_at": Now(),
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
            self._must_exist(session_id)
            return None
        # Owner names are unique per run, so this reads back our own token (or nothing,
        # if the lease was already lost again, which the first fenced write will notice).
        row = (
            AgentSession.objects.filter(id=session_id, lease_owner=owner)
            .values_list("fencing_token", "crash_count")
            .first()
        )
        return None if row is None else Lease(session_id, owner, row[0], crashes=row[1])

    def _session_row(self, session_id: str) -> SessionRow:
        # Only the columns a load needs: `check_state_compat` runs this with the next
        # release's code before that release's migrations, when newer columns don't exist.
        newer = self._newer_columns()
        session = (
            AgentSession.objects.filter(id=session_id)
            .values("agent", "status", "head", "last_seq", *newer)
            .first()
        )
        if session is None:
            raise SessionNotFound(session_id)
        checkpoint = None
        if session["head"]:
            checkpoint = (
                Checkpoint.objects.filter(session__id=session_id, seq=session["head"])
                .order_by("-id")
                .values_list("seq", "state", "reason")
                .first()
            )
        return SessionRow(
            agent=session["agent"],
            status=session["status"],
            last_seq=session["last_seq"],
            checkpoint=checkpoint,
            **{column: session[column] for column in newer},
        )

    def _live_step_rows(self, session_id: str, start: int) -> Iterable[Sequence[Any]]:
        return (
            Step.objects.filter(session__id=session_id, superseded_at__isnull=True, seq__gte=start)
            .order_by("seq")
            .values_list(*LiveStep._fields)
        )

    def _hold(self, lease: Lease) -> bool:
        # SQLite: the transaction is IMMEDIATE (settings), it holds the database's write lock.
        return self._held(lease).exists()

    def _append(self, lease: Lease, rows: AppendRows) -> AppendResult:
        """The same write through the ORM, in one transaction (SQLite: `make run`)."""
        count = rows.count
        now = rows.now
        changes: dict[str, Any] = {
            column: F(column) + amount for column, amount in rows.increments.items()
        }
        changes["updated_at"] = (
            now
            if rows.stale_before is None
            else Case(
                When(updated_at__lt=rows.stale_before, then=Value(now)),
                default=F("updated_at"),
            )
        )
        if rows.checkpoint is not None:
            # Both sides of SET read the old row, so head becomes the new last seq.
            changes["head"] = F("last_seq") + count
        changes.update(rows.values)
        with transaction.atomic():
            if not self._held(lease).update(**changes):
                raise self._fenced_off(lease)
            last_seq, cancel_requested, agent = AgentSession.objects.filter(
                id=lease.session_id
            ).values_list("last_seq", "cancel_requested", "agent")[0]
            first = last_seq - count + 1
            Step.objects.bulk_create(
                [
                    Step(
                        session_id=lease.session_id,
                        seq=first + index,
                        schema_version=SCHEMA_VERSION,
                        created_at=now,
                        **step._asdict(),
                    )
                    for index, step in enumerate(rows.steps)
                ]
            )
            if rows.checkpoint is not None:
                Checkpoint.objects.create(
                    session_id=lease.session_id,
                    seq=last_seq,
                    schema_version=SCHEMA_VERSION,
                    created_at=now,
                    **rows.checkpoint._asdict(),
                )
            for model, calls, t_in, t_out, c_read, c_write, cost, unpriced in rows.usage:
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
