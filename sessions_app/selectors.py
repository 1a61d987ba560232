"""Reads that need care: what the dashboard lists and shows, through the upgraders."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import F, Max, QuerySet

from agent_runtime.state import SCHEMA_VERSION, describe_step
from agent_runtime.upgraders import IncompatibleSchemaError, load_step_payload

from .models import AgentSession, Checkpoint, Status, Step
from .store import DjangoSessionStore

# Sessions a worker may still load: everything but completed and cancelled ones (a failed
# session is resumed by support staff as a matter of course).
RESUMABLE_STATUSES = (
    Status.QUEUED,
    Status.RUNNING,
    Status.WAITING_INPUT,
    Status.PAUSED,
    Status.FAILED,
)


def incompatible_sessions() -> QuerySet[AgentSession]:
    """Sessions no worker could load, newest first, each with `incompatible_reason`
    (and `incompatible_at`, and the schema version of the code that refused it). For the
    dashboard's "needs attention" view; served by the session_incompatible index."""
    return AgentSession.objects.filter(incompatible_at__isnull=False).order_by(
        "-incompatible_at", "id"
    )


@dataclass(frozen=True)
class TraceStep:
    """One step as a person reads it: a line of text, and the payload as stored."""

    step: Step
    text: str
    error: str  # why the payload cannot be loaded by this code ("" when it can)

    @property
    def seq(self) -> int:
        return self.step.seq

    @property
    def kind(self) -> str:
        return self.step.kind

    @property
    def superseded(self) -> bool:
        return self.step.superseded

    @property
    def payload(self) -> Any:
        return self.step.payload

    def get_kind_display(self) -> str:
        return self.step.get_kind_display()


def trace_step(step: Step) -> TraceStep:
    try:
        payload = load_step_payload(step.kind, step.payload, step.schema_version).value
    except IncompatibleSchemaError as exc:
        return TraceStep(step=step, text="", error=str(exc))
    return TraceStep(step=step, text=describe_step(step.kind, payload), error="")


def session_trace(session: AgentSession, *, limit: int = 500) -> list[TraceStep]:
    """The session's steps in order (superseded ones included, marked by the template)."""
    return [trace_step(step) for step in session.steps.order_by("seq")[:limit]]


@dataclass(frozen=True)
class CompatFailure:
    session_id: str
    agent: str
    status: str
    where: str  # "checkpoint at seq 7", "step seq 12 (model)"
    error: str
    incompatible_since: datetime | None = None


@dataclass
class CompatReport:
    schema_version: int
    checked: int = 0
    failures: list[CompatFailure] = field(default_factory=list)
    # newest schema version among the blobs a run loads -> how many sessions
    sessions_per_version: dict[int, int] = field(default_factory=dict)
    # marked incompatible earlier, but this code loads them
    loads_now: list[str] = field(default_factory=list)


def _has_column(model: type[AgentSession], column: str) -> bool:
    with connection.cursor() as cursor:
        description = connection.introspection.get_table_description(cursor, model._meta.db_table)
    return column in {c.name for c in description}


def state_compat_report(*, every_session: bool = False) -> CompatReport:
    """Load every session a worker may still run, exactly as a worker loads it (the head
    checkpoint and the live history, through the upgraders), with this code.

    Reads only columns that exist before this release's migrations: the deploy gate runs
    with the new code against the old schema."""
    sessions = AgentSession.objects.all()
    if not every_session:
        sessions = sessions.filter(status__in=RESUMABLE_STATUSES)
    rows = list(sessions.order_by("created_at", "id").values_list("id", "agent", "status"))
    marked: dict[Any, datetime] = {}
    if _has_column(AgentSession, "incompatible_at"):
        marked = dict(
            AgentSession.objects.filter(
                id__in=sessions.values("id"), incompatible_at__isnull=False
            ).values_list("id", "incompatible_at")
        )
    report = CompatReport(schema_version=SCHEMA_VERSION, checked=len(rows))
    store = DjangoSessionStore()
    for session_id, agent, status in rows:
        try:
            store.load_head(str(session_id))
        except IncompatibleSchemaError as exc:
            report.failures.append(
                CompatFailure(
                    session_id=str(session_id),
                    agent=agent,
                    status=status,
                    where=exc.where or "session",
                    error=exc.detail,
                    incompatible_since=marked.get(session_id),
                )
            )
        else:
            if session_id in marked:
                report.loads_now.append(str(session_id))
    report.sessions_per_version = _sessions_per_version(sessions)
    return report


def _sessions_per_version(sessions: QuerySet[AgentSession]) -> dict[int, int]:
    """Each session counted once, under the newest version among its head checkpoint and
    live steps (the version of the code that last wrote to it)."""
    ids = sessions.values("id")
    newest: dict[Any, int] = dict(
        Step.objects.filter(session_id__in=ids, superseded_at__isnull=True)
        .values_list("session_id")
        .annotate(version=Max("schema_version"))
    )
    heads = (
        Checkpoint.objects.filter(session_id__in=ids, seq=F("session__head"))
        .values_list("session_id")
        .annotate(version=Max("schema_version"))
    )
    for session_id, version in heads:
        newest[session_id] = max(version, newest.get(session_id, 0))
    counts: dict[int, int] = {}
    for version in newest.values():
        counts[version] = counts.get(version, 0) + 1
    return dict(sorted(counts.items()))
