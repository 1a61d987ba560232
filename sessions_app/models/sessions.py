"""Durable agent state: sessions, their append-only steps, checkpoints and the audit log."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.postgres.search import SearchVectorField
from django.db import models
from django.db.models import Exists, Q
from django.utils import timezone

from agent_runtime.loop import BUDGET_REACHED
from agent_runtime.state import (
    SCHEMA_VERSION,
    CheckpointReason,
    PayloadField,
    SessionStatus,
    StepKind,
    SystemEvent,
    step_action,
    step_event,
)

from ..fields import UNREADABLE_TIMES
from ..redaction import (
    ScrubbedCharField,
    ScrubbedJSONField,
    ScrubbedJSONTextField,
    ScrubbedTextField,
)
from ..sdk_glue import PROGRAM_AGENTS
from .clock import database_clock


class Status(models.TextChoices):
    QUEUED = SessionStatus.QUEUED.value, "Queued"
    RUNNING = SessionStatus.RUNNING.value, "Running"
    WAITING_INPUT = SessionStatus.WAITING_INPUT.value, "Waiting for input"
    PAUSED = SessionStatus.PAUSED.value, "Paused"
    COMPLETED = SessionStatus.COMPLETED.value, "Completed"
    FAILED = SessionStatus.FAILED.value, "Failed"
    CANCELLED = SessionStatus.CANCELLED.value, "Cancelled"


RUNNABLE = (Status.QUEUED, Status.RUNNING)
FINAL = (Status.COMPLETED, Status.FAILED, Status.CANCELLED)
# Stopped on its own: a person's input (a message, an instruction, a corrected result)
# continues it.
TAKES_INPUT = (Status.COMPLETED, Status.PAUSED, Status.FAILED)
# Not completed or cancelled: a worker may still load it (support staff resume a failed
# session as a matter of course), so a deploy must be able to read it.
LOADABLE = (Status.QUEUED, Status.RUNNING, Status.WAITING_INPUT, Status.PAUSED, Status.FAILED)


def current_schema_version() -> int:
    """Default of the schema_version columns: writers only ever emit the current version.
    A function, not the constant, so that bumping SCHEMA_VERSION needs no schema migration."""
    return SCHEMA_VERSION


class Kind(models.TextChoices):
    USER = StepKind.USER.value, "User"
    MODEL = StepKind.MODEL.value, "Model"
    TOOL_CALL = StepKind.TOOL_CALL.value, "Tool call"
    TOOL_RESULT = StepKind.TOOL_RESULT.value, "Tool result"
    ERROR = StepKind.ERROR.value, "Error"
    OPERATOR = StepKind.OPERATOR.value, "Operator"
    SYSTEM = StepKind.SYSTEM.value, "System"


class Reason(models.TextChoices):
    AUTO = CheckpointReason.AUTO.value, "Automatic"
    MANUAL = CheckpointReason.MANUAL.value, "Manual"
    BEFORE_ROLLBACK = CheckpointReason.BEFORE_ROLLBACK.value, "Before rollback"
    MIGRATION = CheckpointReason.MIGRATION.value, "Migration"


class AgentSession(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.CharField(max_length=100)
    # The agent version the session started on ("" for sessions started before versions
    # were recorded). Which versions may continue it: Agent.refusal in agent_runtime.
    agent_version = models.CharField(max_length=50, blank=True, default="", db_default="")
    title = ScrubbedCharField(max_length=300, blank=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.QUEUED)
    # seq of the current checkpoint (0: none yet); last_seq: the highest seq allocated.
    head = models.PositiveIntegerField(default=0)
    last_seq = models.PositiveIntegerField(default=0)
    # The lease: one worker at a time. Every write is conditional on fencing_token.
    lease_owner = models.CharField(max_length=200, null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    fencing_token = models.BigIntegerField(default=0)
    cancel_requested = models.BooleanField(default=False)
    # Poison detection: takeovers in a row of an expired lease at the same last_seq.
    crash_count = models.PositiveSmallIntegerField(default=0, db_default=0)
    crash_seq = models.IntegerField(default=-1, db_default=-1)
    # Dispatch bookkeeping for the reconciler: which RQ job should run it, since when.
    job_id = models.CharField(max_length=64, blank=True)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    last_error = ScrubbedTextField(blank=True)
    step_count = models.PositiveIntegerField(default=0)
    tokens_in = models.BigIntegerField(default=0)
    tokens_out = models.BigIntegerField(default=0)
    cost = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    final_answer = ScrubbedTextField(blank=True)
    # Batch work's progress (records done / total), copied from the batch cursor of the
    # head checkpoint's state so lists and the API show it without loading a checkpoint.
    progress_done = models.PositiveIntegerField(null=True, blank=True)
    progress_total = models.PositiveIntegerField(null=True, blank=True)
    # What a running tool last said of its progress (ToolContext.report_progress).
    progress_note = ScrubbedCharField(max_length=200, blank=True, default="", db_default="")
    # Tool calls whose live result is an error (a person's rejection and a result an
    # operator corrected aside), counted when the session completes: a session that
    # completed with failed calls may be missing their effects ("needs attention").
    failed_calls = models.PositiveIntegerField(default=0, db_default=0)
    # Set when a worker could not load the session (a blob newer than its code, or one that
    # does not have its version's shape): why, when, and the SCHEMA_VERSION of that code.
    # Such a session is not dispatched again until code with a newer SCHEMA_VERSION runs
    # the reconciler; a successful run, upgrade_state or an operator's resume clears it.
    # The database default lets the previous release keep inserting sessions between
    # `migrate` and the restart, and after a rollback of the code.
    incompatible_reason = ScrubbedTextField(blank=True, default="", db_default="")
    incompatible_at = models.DateTimeField(null=True, blank=True)
    incompatible_code_schema = models.PositiveSmallIntegerField(null=True, blank=True)
    # The version of the session's agent on the code that marked it ("": it had none): a
    # worker with another version of the agent gets a try at it.
    incompatible_agent_version = models.CharField(
        max_length=50, blank=True, default="", db_default=""
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="forks"
    )
    # The work queue: the person who took the session (or was handed it), and since when.
    # Changed only by services.queue (take, hand), each change audited; no FK index of its
    # own: the (owner, updated_at) index below serves it.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,
    )
    owned_since = models.DateTimeField(null=True, blank=True)
    fork_seq = models.PositiveIntegerField(null=True, blank=True)
    # Retention: a session on legal hold is never pruned (sessions_app.upkeep.retention); steps
    # that were superseded and then compacted away keep their seqs, counted here.
    legal_hold = models.BooleanField(default=False, db_default=False)
    legal_hold_note = ScrubbedCharField(max_length=300, blank=True, default="", db_default="")
    compacted_steps = models.PositiveIntegerField(default=0, db_default=0)
    # The wall-time budget: the session is paused (not failed) at its next model call once
    # this has passed; set at start (the API's budgets.max_seconds, else the agent's
    # Limits.max_seconds), moved by an operator's "set budgets".
    deadline_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            # The dashboard list by status, latest activity first (keyset: updated_at, id).
            models.Index(fields=["status", "-updated_at", "-id"], name="session_status_updated"),
            # The unfiltered list and its keyset cursor.
            models.Index(fields=["-updated_at", "-id"], name="session_updated"),
            # Filter by agent.
            models.Index(fields=["agent", "-updated_at", "-id"], name="session_agent_updated"),
            # Filter by owner ("mine", someone's, and unassigned: owner IS NULL).
            models.Index(fields=["owner", "-updated_at", "-id"], name="session_owner_updated"),
            # Filter by agent and version; the agents page's live sessions per version.
            models.Index(
                fields=["agent", "agent_version", "-updated_at", "-id"],
                name="session_agent_version",
            ),
            # The list sorted by creation (newest or oldest first), alone or by status/agent.
            models.Index(fields=["-created_at", "-id"], name="session_created"),
            models.Index(fields=["status", "-created_at", "-id"], name="session_status_created"),
            models.Index(fields=["agent", "-created_at", "-id"], name="session_agent_created"),
            # The reconciler: runnable sessions whose lease is free or expired.
            models.Index(
                fields=["lease_expires_at"],
                name="session_runnable_lease",
                condition=Q(status__in=["queued", "running"]),
            ),
            # "Needs attention": sessions no worker could load, newest first.
            models.Index(
                fields=["-incompatible_at"],
                name="session_incompatible",
                condition=Q(incompatible_at__isnull=False),
            ),
            # "Needs attention": sessions that completed with failed tool calls.
            models.Index(
                fields=["updated_at", "id"],
                name="session_completed_failed",
                condition=Q(status="completed", failed_calls__gt=0),
            ),
            # The admin's "stuck" filter: runnable sessions, latest activity first.
            models.Index(
                fields=["-updated_at", "-id"],
                name="session_runnable_updated",
                condition=Q(status__in=["queued", "running"]),
            ),
            # The admin's title search (upper(title) LIKE '%...%') is served by a trigram
            # index on PostgreSQL, created in migration 0011_admin_indexes (not expressible
            # here portably).
        ]

    def __str__(self) -> str:
        return self.title or f"{self.agent} {self.id}"

    def damage(self) -> list[str]:
        """What of this row cannot be shown as it is stored (written by hand with SQL, or by
        an older release): times Python cannot hold (read as the nearest it can; see
        sessions_app.fields), a status this code does not know. Empty when none."""
        found = [
            f"{f.name} is outside the years 1 to 9999"
            for f in self._meta.concrete_fields
            if isinstance(f, models.DateTimeField) and getattr(self, f.attname) in UNREADABLE_TIMES
        ]
        if self.status not in Status.values:
            found.append(f"status {self.status!r} is not one this code knows")
        return found

    def lease_is_live(self, now=None) -> bool:
        now = now or database_clock()
        return bool(self.lease_owner and self.lease_expires_at and self.lease_expires_at > now)

    @property
    def is_incompatible(self) -> bool:
        return self.incompatible_at is not None

    # What "stuck" means. A running session whose lease expired is stuck: its worker is
    # gone (the reconciler hands it to another one within about a lease's time). A queued
    # session is stuck when its dispatch is older than RESPAWN_DISPATCH_GRACE *and no
    # worker is busy*: no runnable session holds a live lease, so the workers are idle or
    # gone, and an idle worker would have taken it. While some worker runs a session, a
    # queued one is waiting its turn in the queue (the reconciler re-dispatches a job
    # Redis lost, or one a dead worker had taken), not stuck: a burst of sessions behind
    # one slow run is not an alarm. It becomes one once no worker is running anything and
    # it is still queued past the grace period.

    @staticmethod
    def leased(now=None) -> models.QuerySet[AgentSession]:
        """Runnable sessions a worker holds a live lease on (the reconciler's partial index)."""
        now = now or database_clock()
        return (
            AgentSession.objects.filter(status__in=RUNNABLE, lease_expires_at__gt=now)
            .exclude(lease_owner__isnull=True)
            .exclude(lease_owner="")
        )

    @staticmethod
    def workers_busy(now=None) -> Exists:
        """Whether some worker is running a session, as an expression (uncorrelated: the
        database evaluates it once per statement)."""
        return Exists(AgentSession.leased(now))

    @staticmethod
    def stuck_q(now=None) -> Q:
        """is_stuck as a query (the admin's filter, "needs attention", the metrics; a test
        keeps the two in step)."""
        now = now or database_clock()
        grace = now - timedelta(seconds=settings.RESPAWN_DISPATCH_GRACE)
        no_live_lease = (
            Q(lease_owner__isnull=True)
            | Q(lease_owner="")
            | Q(lease_expires_at__isnull=True)
            | Q(lease_expires_at__lte=now)
        )
        waited = (Q(dispatched_at__isnull=True) | Q(dispatched_at__lt=grace)) & Q(
            ~AgentSession.workers_busy(now)
        )
        overdue = Q(status=Status.RUNNING) | (Q(status=Status.QUEUED) & waited)
        return Q(status__in=RUNNABLE, incompatible_at__isnull=True) & no_live_lease & overdue

    @property
    def is_final(self) -> bool:
        """Completed, failed or cancelled: nothing will run it unless a person does."""
        return self.status in FINAL

    def is_stuck(self, now=None) -> bool:
        """Should be running, but nobody holds a live lease and nothing will run it: a
        running session whose lease expired, or a queued one dispatched longer ago than
        the grace period while no worker is busy (see above). A list that reads many
        sessions annotates `busy_workers` (selectors) so this asks nothing more.
        (An incompatible session is not stuck: it waits for code that can load it.)"""
        now = now or database_clock()
        if self.status not in RUNNABLE or self.lease_is_live(now) or self.is_incompatible:
            return False
        if self.status == Status.RUNNING:
            return True
        grace = timedelta(seconds=settings.RESPAWN_DISPATCH_GRACE)
        if self.dispatched_at is not None and self.dispatched_at >= now - grace:
            return False
        busy = getattr(self, "busy_workers", None)
        if busy is None:
            busy = AgentSession.leased(now).exists()
        return not busy

    @property
    def progress_percent(self) -> int | None:
        """Batch work done, in whole percent (None for a session without batch work)."""
        if self.progress_total is None:
            return None
        if not self.progress_total:
            return 100
        return min(100, (self.progress_done or 0) * 100 // self.progress_total)

    def head_checkpoints(self):
        """The head checkpoint as a query: the last one written at seq `head` (a rollback
        may leave an older copy at the same seq). What a worker's load_head loads."""
        return Checkpoint.objects.filter(session=self, seq=self.head).order_by("-id")

    def head_checkpoint(self) -> Checkpoint | None:
        return self.head_checkpoints().first()

    # --- What each status allows -----------------------------------------------------
    # The one rule per action: the services refuse by it, the dashboard, the API and the
    # admin offer the action by it (templates ask `session.can_x`, never the raw status).
    # A refusal is (message, error code), the code one of services.ActionError's.

    @property
    def is_runnable(self) -> bool:
        """Queued or running: a worker runs it, or will (the dashboard keeps polling it)."""
        return self.status in RUNNABLE

    def has_live_worker(self, now=None) -> bool:
        """Running, and a worker holds its lease: a cancel stops that worker mid-run."""
        return self.status == Status.RUNNING and self.lease_is_live(now)

    @property
    def paused_by_budget(self) -> bool:
        """Paused because a budget (steps, tokens, cost, wall time) was used up."""
        return self.status == Status.PAUSED and self.last_error.startswith(BUDGET_REACHED)

    @staticmethod
    def paused_by_budget_q() -> Q:
        """paused_by_budget as a query ("needs attention")."""
        return Q(status=Status.PAUSED, last_error__startswith=BUDGET_REACHED)

    def run_by_program(self) -> bool:
        """A session a program writes itself (RespawnSaver or RespawnSession under their
        default agent name, with no agent of that name registered here): Respawn's workers
        do not run it, so nothing may queue it for them."""
        if self.agent not in PROGRAM_AGENTS:
            return False
        from ..runtime import agent_registry

        return self.agent not in agent_registry().names()

    def program_refusal(self) -> tuple[str, str] | None:
        """Why an action that queues the session for a worker is refused: its own program
        runs it."""
        if self.run_by_program():
            return (
                f"this session is run by its own program ({PROGRAM_AGENTS[self.agent]}), "
                "not by Respawn's workers: continue it from that program",
                "bad_status",
            )
        return None

    def resume_refusal(self) -> tuple[str, str] | None:
        """Why a resume is refused now (message, error code), or None: the one rule the
        resume action enforces and the dashboard offers the button by."""
        if (refusal := self.program_refusal()) is not None:
            return refusal
        if self.status in RUNNABLE and self.lease_is_live():
            return "session is already running", "already_running"
        if self.status in RUNNABLE and not self.is_stuck() and not self.is_incompatible:
            # Queued and dispatched moments ago: a worker will take it. Resuming again
            # would only hand out a second job (and, under a burst of clicks, many).
            return "session is already queued; a worker will pick it up", "already_running"
        if self.status == Status.COMPLETED:
            return (
                "a completed session cannot be resumed; send it a new message instead",
                "bad_status",
            )
        if self.status == Status.CANCELLED:
            return (
                "a cancelled session cannot be resumed; roll it back to one of its "
                "checkpoints to run it again",
                "bad_status",
            )
        if self.status == Status.WAITING_INPUT:
            return (
                "session is waiting for an approval: approve or reject the pending tool call",
                "bad_status",
            )
        return None

    def can_resume(self) -> bool:
        return self.resume_refusal() is None

    def cancel_refusal(self) -> tuple[str, str] | None:
        """A session is cancelled at once, running or not, unless it has already ended."""
        if self.status in FINAL:
            return f"session is already {self.status}", "bad_status"
        return None

    def can_cancel(self) -> bool:
        return self.cancel_refusal() is None

    def message_refusal(self) -> tuple[str, str] | None:
        """A new user message continues a session that has stopped on its own."""
        if (refusal := self.program_refusal()) is not None:
            return refusal
        if self.status == Status.WAITING_INPUT:
            return (
                "session is waiting for an approval: approve or reject the pending tool call first",
                "bad_status",
            )
        if self.status not in TAKES_INPUT:
            return (
                f"cannot send a message to a {self.get_status_display().lower()} session "
                "(only completed, paused or failed ones take new messages)",
                "already_running" if self.status == Status.RUNNING else "bad_status",
            )
        return None

    def can_message(self) -> bool:
        return self.message_refusal() is None

    def edit_refusal(self) -> tuple[str, str] | None:
        """An operator's instruction or corrected tool result, then a resume."""
        if (refusal := self.program_refusal()) is not None:
            return refusal
        if self.status in RUNNABLE:
            return (
                "cannot edit a session that is queued or running; cancel it or wait",
                "already_running",
            )
        if self.status not in TAKES_INPUT:
            return f"a {self.get_status_display().lower()} session cannot be edited", "bad_status"
        return None

    def can_edit(self) -> bool:
        return self.edit_refusal() is None

    def budgets_refusal(self) -> tuple[str, str] | None:
        """Budgets change between runs, never under a worker; a cancelled session has
        none left to change."""
        if self.status in RUNNABLE:
            return (
                "cannot change the budgets of a queued or running session; cancel it or "
                "wait for it to pause",
                "already_running",
            )
        if self.status == Status.CANCELLED:
            return "a cancelled session has no budgets to change", "bad_status"
        return None

    def can_set_budgets(self) -> bool:
        return self.budgets_refusal() is None

    def budgets_resume(self) -> bool:
        """Whether new budgets may queue the session to continue (a paused or failed one)."""
        return self.status in (Status.PAUSED, Status.FAILED) and not self.run_by_program()

    def rollback_refusal(self) -> tuple[str, str] | None:
        """Any session may go back to a checkpoint, except under a live worker."""
        if self.status in RUNNABLE and self.lease_is_live():
            return "cannot roll back a running session; cancel it or wait", "already_running"
        return None

    def can_roll_back(self) -> bool:
        return self.rollback_refusal() is None

    def can_fork(self) -> bool:
        """A fork copies the history up to a checkpoint, whatever the status (a running
        session's checkpoints are as final as a finished one's)."""
        return True

    def decision_refusal(self) -> tuple[str, str] | None:
        """A person's decision (approve or reject a call, decide an uncertain call, answer
        a graph's question) is taken only while the session waits for one, and a worker
        carries it out."""
        if (refusal := self.program_refusal()) is not None:
            return refusal
        if self.status != Status.WAITING_INPUT:
            return "nothing is waiting for approval in this session", "bad_status"
        return None

    def can_decide(self) -> bool:
        return self.decision_refusal() is None

    def graph_thread_or_none(self):
        """The LangGraph thread this session is (sessions_app.langgraph.saver), or None."""
        try:
            return self.graph_thread
        except models.ObjectDoesNotExist:
            return None


def payload_key(*path: str) -> str:
    """The ORM lookup of a step payload's field, by its PayloadField names (and a lookup
    such as "in"): payload_key(PayloadField.USAGE, PayloadField.COST) is
    "payload__usage__cost"."""
    return "__".join(("payload", *path))


def payload_q(*path: str, value: Any, **fields: Any) -> Q:
    """Steps whose payload field at `path` (as payload_key spells it) matches `value`
    (and whose other `fields` match, as in Q(...))."""
    return Q(**{payload_key(*path): value}, **fields)


# A step that failed: an error step, or a tool result with an error (the trace's "first
# error" and "failed" filter). The step_failed partial index's condition, so the queries
# that use this same expression are served by it.
STEP_FAILED = Q(kind=StepKind.ERROR) | payload_q(
    PayloadField.STATUS, value="error", kind=StepKind.TOOL_RESULT
)
# A run's first step: the step_run_started partial index's condition.
RUN_STARTED = payload_q(PayloadField.EVENT, value=SystemEvent.RUN_STARTED, kind=StepKind.SYSTEM)


class Step(models.Model):
    # No index of its own: step_session_seq_unique starts with session_id and serves every
    # lookup by session (one index fewer to update on every step).
    session = models.ForeignKey(
        AgentSession, on_delete=models.CASCADE, related_name="steps", db_index=False
    )
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=20, choices=Kind.choices)
    payload = ScrubbedJSONField()
    schema_version = models.PositiveSmallIntegerField(default=current_schema_version)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    tokens_in = models.PositiveIntegerField(default=0)
    tokens_out = models.PositiveIntegerField(default=0)
    idempotency_key = models.CharField(max_length=100, null=True, blank=True)
    # Set by a rollback (the seq of the checkpoint rolled back to); never deleted.
    superseded_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # The trace is ordered by seq; also serves "steps of a session after seq N".
            models.UniqueConstraint(fields=["session", "seq"], name="step_session_seq_unique"),
        ]
        indexes = [
            # "Jump to first error" and per-kind filters inside one trace.
            # Partial (model and error steps only, a third of them): a run's tail finds the
            # last model step, "jump to first error" the first error; other kinds are found
            # within a session on step_session_seq_unique.
            models.Index(
                fields=["session", "kind", "seq"],
                name="step_session_kind_seq",
                condition=Q(kind__in=["model", "error"]),
            ),
            # Superseded steps of a session (the toggle's count), a small set: partial.
            models.Index(
                fields=["session", "seq"],
                name="step_superseded",
                condition=Q(superseded_at__isnull=False),
            ),
            # The admin's step list across sessions, newest first, by kind.
            # Partial, for the kinds that are rare and sought (errors, operators' steps):
            # the common kinds are found at once walking the primary key backwards.
            models.Index(
                fields=["kind", "-id"],
                name="step_kind_id",
                condition=Q(kind__in=["error", "operator"]),
            ),
            # Steps at a rare schema version (old, or newer than the code); nearly every
            # row has the same value, which B-tree deduplication stores in little space.
            models.Index(fields=["schema_version"], name="step_version"),
            # The failed steps of a session (errors, failed tool results): the trace's
            # "first error" and "failed" filter, the header's failure count. Partial: only
            # failed steps are in it, so appending a step that worked costs nothing here.
            models.Index(
                fields=["session", "seq"],
                name="step_failed",
                condition=STEP_FAILED,
            ),
            # The runs of a session (their run_started steps): the trace's run numbers and
            # the worker of the run a page starts in, the timeline's run marks. One entry
            # per run.
            models.Index(
                fields=["session", "seq"],
                name="step_run_started",
                condition=RUN_STARTED,
            ),
        ]
        ordering = ["session", "seq"]

    def __str__(self) -> str:
        return f"{self.session_id} #{self.seq} {self.kind}"

    @property
    def event(self) -> str:
        """A system step's SystemEvent ("" for other kinds)."""
        return step_event(self.kind, self.payload) or ""

    @property
    def action(self) -> str:
        """An operator step's OperatorAction ("" for other kinds)."""
        return step_action(self.kind, self.payload) or ""

    @property
    def superseded(self) -> bool:
        return self.superseded_at is not None


class Checkpoint(models.Model):
    # No index of its own: checkpoint_session_seq_reason_unique starts with session_id.
    session = models.ForeignKey(
        AgentSession, on_delete=models.CASCADE, related_name="checkpoints", db_index=False
    )
    seq = models.PositiveIntegerField()
    # Compact JSON text on PostgreSQL (migration 0028): written once a turn, read whole.
    state = ScrubbedJSONTextField()
    schema_version = models.PositiveSmallIntegerField(default=current_schema_version)
    reason = models.CharField(max_length=20, choices=Reason.choices, default=Reason.AUTO)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # Loading the head: the checkpoint of a session at its head seq.
            models.UniqueConstraint(
                fields=["session", "seq", "reason"], name="checkpoint_session_seq_reason_unique"
            ),
        ]
        indexes = [
            # The admin's checkpoint list, newest first, by reason.
            # Partial: the reasons other than "auto" are the rare ones a filter looks for.
            models.Index(
                fields=["reason", "-id"],
                name="checkpoint_reason_id",
                condition=~Q(reason="auto"),
            ),
            # Checkpoints at a rare schema version, for the checkpoint list and the session
            # list's "head schema version" filter (deduplicated, like step_version).
            models.Index(fields=["schema_version"], name="checkpoint_version"),
        ]
        ordering = ["session", "seq"]

    def __str__(self) -> str:
        return f"{self.session_id} @{self.seq} ({self.reason})"


class StepSearch(models.Model):
    """The full-text index of CHUNK consecutive steps of a session (sessions_app.upkeep.search):
    the stripped tsvector of their payloads, written in batches after the steps, on
    PostgreSQL only. A GIN index on `tsv` (migration 0018_step_search_off_the_append, not
    expressible portably here) serves the session list's search."""

    # No constraint: a session's index rows go with it (retention deletes both), and a
    # row left behind matches no session.
    session = models.ForeignKey(
        AgentSession,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="+",
    )
    chunk = models.PositiveIntegerField()
    first_seq = models.PositiveIntegerField()
    last_seq = models.PositiveIntegerField()
    tsv = SearchVectorField()

    class Meta:
        constraints = [
            # One row per chunk; also the indexer's high-water mark per session.
            models.UniqueConstraint(fields=["session", "chunk"], name="stepsearch_chunk_unique"),
        ]


class ModelUsage(models.Model):
    """What the model calls of one session cost on one day with one model. Written by the
    append that stores the model step (the same statement), so it is never ahead of or
    behind the trace; one writer per session, so no two workers contend for a row. Not
    tied to the session by a constraint: the totals outlive retention's deletes. Summed
    by day, agent and model for the costs page, the API and /metrics."""

    day = models.DateField()
    session_id = models.UUIDField()
    agent = models.CharField(max_length=100)
    model = models.CharField(max_length=200)
    calls = models.PositiveIntegerField(default=0)
    tokens_in = models.BigIntegerField(default=0)
    tokens_out = models.BigIntegerField(default=0)
    cache_read_tokens = models.BigIntegerField(default=0)
    cache_write_tokens = models.BigIntegerField(default=0)
    cost = models.DecimalField(max_digits=14, decimal_places=6, default=0)
    # Calls of a model the price table has no price for (their cost is counted as 0).
    unpriced_calls = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["session_id", "day", "model"], name="usage_session_day_model"
            ),
        ]
        indexes = [
            models.Index(fields=["day"], name="usage_day"),
            models.Index(fields=["agent", "day"], name="usage_agent_day"),
        ]


class SearchCursor(models.Model):
    """How far (by step id) the search indexer has read: one row."""

    step_id = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)


class AuditAction(models.TextChoices):
    """Everything an audit event may record (services.audit refuses anything else)."""

    START = "start", "started a session"
    RESUME = "resume", "resumed"
    CANCEL = "cancel", "cancelled"
    ROLLBACK = "rollback", "rolled back to a checkpoint"
    FORK = "fork", "forked (on the parent)"
    FORKED = "forked", "forked (on the fork)"
    APPROVE = "approve", "approved a tool call"
    REJECT = "reject", "rejected a tool call"
    MESSAGE = "message", "sent a message"
    INSTRUCTION = "instruction", "added an instruction"
    CORRECT_RESULT = "correct_result", "corrected a tool result"
    UNCERTAIN_RERUN = "uncertain_rerun", "reran an uncertain call"
    UNCERTAIN_RECORD_RESULT = "uncertain_record_result", "recorded an uncertain call's result"
    UNCERTAIN_FAIL = "uncertain_fail", "failed over an uncertain call"
    SET_BUDGETS = "set_budgets", "set budgets"
    LEGAL_HOLD = "legal_hold", "put on legal hold"
    LEGAL_HOLD_RELEASE = "legal_hold_release", "released from legal hold"
    ANSWER_INTERRUPT = "answer_interrupt", "answered a graph's interrupt"
    GRAPH_COPY_THREAD = "graph_copy_thread", "copied a graph thread"
    GRAPH_DELETE_THREAD = "graph_delete_thread", "deleted a graph thread"
    EXPORT = "export", "exported"
    IMPORT = "import", "imported"
    COMPAT_CHECK = "compat_check", "ran the deploy gate"
    ADMIN_EDIT_SESSION = "admin_edit_session", "edited a session in the admin"
    ADMIN_EDIT_STEP = "admin_edit_step", "edited a step in the admin"
    ADMIN_EDIT_CHECKPOINT = "admin_edit_checkpoint", "edited a checkpoint in the admin"
    ADMIN_ISSUE_TOKEN = "admin_issue_token", "issued an API token"
    ADMIN_REVOKE_TOKEN = "admin_revoke_token", "revoked an API token"
    RETENTION_DELETE = "retention_delete", "retention deleted sessions"
    RETENTION_CHECKPOINTS = "retention_checkpoints", "retention pruned checkpoints"
    RETENTION_COMPACT = "retention_compact", "retention compacted steps"
    LATE_TOOL_CALL = "late_tool_call", "a fenced-off worker had started a tool call"
    CREDENTIAL_GUESSING = "credential_guessing", "locked out an address guessing credentials"
    REPAIR_TIMES = "repair_times", "moved times no page could read into range"
    TAKE = "take", "took the session"
    TAKE_OVER = "take_over", "took the session over from its owner"
    HAND = "hand", "handed the session to someone"
    UNASSIGN = "unassign", "put the session back in the queue (no owner)"
    NOTE = "note", "left a note"
    ALERT_RULE_CREATE = "alert_rule_create", "created an alert rule"
    ALERT_RULE_ENABLE = "alert_rule_enable", "switched an alert rule on"
    ALERT_RULE_DISABLE = "alert_rule_disable", "switched an alert rule off"
    ALERT_RULE_DELETE = "alert_rule_delete", "deleted an alert rule"
    TEAM_ISSUE_TOKEN = "team_issue_token", "issued a team API token"
    TEAM_REVOKE_TOKEN = "team_revoke_token", "revoked a team API token"
    ALERT_RULE_TEST = "alert_rule_test", "sent a test alert"


class AuditEvent(models.Model):
    """Append-only: a database trigger refuses every UPDATE and DELETE (migration
    0007_audit_append_only). The foreign keys are unconstrained and untouched when a user
    or session is deleted, so the record keeps pointing at what it was about."""

    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="+",
    )
    actor_label = ScrubbedCharField(max_length=200, help_text="Who acted, kept if the user goes.")
    action = models.CharField(max_length=50)
    session = models.ForeignKey(
        AgentSession,
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="audit_events",
    )
    before = ScrubbedJSONField(default=dict, blank=True)
    after = ScrubbedJSONField(default=dict, blank=True)
    request_meta = ScrubbedJSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            # The audit log, newest first, and per session.
            models.Index(fields=["-created_at"], name="audit_created"),
            models.Index(fields=["session", "-created_at"], name="audit_session_created"),
            # The admin's filter by action.
            models.Index(fields=["action", "-created_at"], name="audit_action_created"),
        ]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.actor_label} {self.action} {self.session_id}"


class SessionNote(models.Model):
    """A person's plain-text note on a session (the work queue): who wrote it, when, and
    the session's last step then (`seq`: the trace shows it in the margin beside that
    step). Never rendered as HTML or Markdown; written by services.queue, audited."""

    session = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="notes")
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    author_label = ScrubbedCharField(
        max_length=200, help_text="Who wrote it, kept if the user goes."
    )
    text = ScrubbedTextField()
    seq = models.PositiveIntegerField(help_text="The session's last step when it was written.")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            # A session's notes in trace order (the margin, a page of steps at a time).
            models.Index(fields=["session", "seq", "id"], name="note_session_seq"),
        ]

    def __str__(self) -> str:
        return f"note by {self.author_label} on {self.session_id} at #{self.seq}"


class ImportedAuditRecord(models.Model):
    """An audit record that came in an imported file: what another deployment (or a file's
    author) says happened there. Kept apart from AuditEvent so the audit log only ever
    holds this deployment's own actions; shown on the session page as imported text,
    with its origin. Its action is whatever the file said, not one of AuditAction."""

    session = models.ForeignKey(
        AgentSession, on_delete=models.CASCADE, related_name="imported_audit"
    )
    position = models.PositiveIntegerField()
    origin = ScrubbedCharField(max_length=300)
    actor_label = ScrubbedCharField(max_length=200, blank=True)
    action = ScrubbedCharField(max_length=50, blank=True)
    before = ScrubbedJSONField(default=dict, blank=True)
    after = ScrubbedJSONField(default=dict, blank=True)
    request_meta = ScrubbedJSONField(default=dict, blank=True)
    recorded_at = models.DateTimeField(null=True, blank=True)
    imported_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # The file's order; also serves "the imported history of a session".
            models.UniqueConstraint(
                fields=["session", "position"], name="imported_audit_session_position"
            ),
        ]
        ordering = ["session", "position"]

    def __str__(self) -> str:
        return f"imported: {self.actor_label} {self.action} {self.session_id}"


class SideEffect(models.Model):
    """The demo tools' externally visible effect: one row per idempotency key.

    `attempts` counts executions, so a tool that ran twice for one key is visible."""

    key = models.CharField(max_length=100, unique=True)
    session_id = models.UUIDField(db_index=True)
    tool = models.CharField(max_length=100)
    payload = ScrubbedJSONField(default=dict)
    attempts = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.key


class DemoRecord(models.Model):
    """A record the `migrate` demo agent migrates: one dataset per session, numbered 1..N.

    `migrations` counts how often a record was migrated, so a record migrated twice would
    show; `migrated_by_key` names the batch (tool call key) that did it."""

    dataset = models.CharField(max_length=64)
    number = models.PositiveIntegerField()
    payload = ScrubbedJSONField()
    output = ScrubbedJSONField(null=True, blank=True)
    migrated_at = models.DateTimeField(null=True, blank=True)
    migrated_by_key = models.CharField(max_length=100, blank=True)
    migrations = models.PositiveSmallIntegerField(default=0)

    class Meta:
        constraints = [
            # A batch reads a range of numbers of one dataset.
            models.UniqueConstraint(fields=["dataset", "number"], name="demorecord_number_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.dataset} #{self.number}"


class DemoBatch(models.Model):
    """One migrated batch per idempotency key: a batch run again with its key finds this row
    and migrates nothing (it is written in the transaction that migrates the records)."""

    key = models.CharField(max_length=100, unique=True)
    dataset = models.CharField(max_length=64)
    start = models.PositiveIntegerField()
    end = models.PositiveIntegerField()
    migrated = models.PositiveIntegerField()
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.key} ({self.start}..{self.end})"


class ApiToken(models.Model):
    """A per-user bearer token for the JSON API. Only a SHA-256 hash is stored; the token
    itself is shown once, when it is created."""

    PREFIX = "rsp_"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = ScrubbedCharField(max_length=100, blank=True)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    key_prefix = models.CharField(
        max_length=12, editable=False, help_text="First characters, to tell tokens apart."
    )
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # A team token reads and acts on its team's sessions only, with its own role there,
    # and never more than its user may (sessions_app.permissions). Without a team it acts
    # with its user's roles, capped to `role` when one is given.
    team = models.ForeignKey(
        "sessions_app.Team",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="api_tokens",
    )
    role = models.CharField(
        max_length=20,
        blank=True,
        choices=[("viewer", "viewer"), ("operator", "operator"), ("team_admin", "team admin")],
        help_text="Caps what the token may do; empty: its user's roles.",
    )
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty: never expires.")

    def __str__(self) -> str:
        return f"{self.key_prefix}… ({self.user})"

    @staticmethod
    def hash(raw: str) -> str:
        import hashlib

        return hashlib.sha256(raw.encode()).hexdigest()

    @classmethod
    def issue(
        cls, user, name: str = "", *, team=None, role: str = "", expires_at=None
    ) -> tuple[ApiToken, str]:
        """Create a token (a team's, with its role, when `team` is given); returns it with
        the raw secret (never stored)."""
        import secrets

        raw = cls.PREFIX + secrets.token_urlsafe(30)
        token = cls.objects.create(
            user=user,
            name=name,
            key_hash=cls.hash(raw),
            key_prefix=raw[:10],
            team=team,
            role=role,
            expires_at=expires_at,
        )
        return token, raw

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None and not self.is_expired

    @property
    def is_expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()


class LoginFailure(models.Model):
    """A failed log-in, for throttling by account and by address (sessions_app/web/auth.py).

    `account` is a keyed hash of the normalised username, never the username itself: what
    someone typed into the username field (a password, at times) is not stored."""

    account = models.CharField(max_length=64)
    ip = models.GenericIPAddressField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            # "Failures of this account / from this address in the last window."
            models.Index(fields=["account", "created_at"], name="loginfail_account"),
            models.Index(fields=["ip", "created_at"], name="loginfail_ip"),
            # Dropping failures older than the window.
            models.Index(fields=["created_at"], name="loginfail_created"),
        ]
