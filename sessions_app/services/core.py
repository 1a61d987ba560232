"""Operator and client actions on sessions. Dashboard, API, admin and management commands
all call these, so the rules (what each status allows, the audit record, enqueue after
commit) live in one place."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any, TypeGuard

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from agent_runtime.agents import UnknownAgent
from agent_runtime.state import (
    SCHEMA_VERSION,
    STATE_BUDGETS,
    OperatorAction,
    OperatorPayload,
    SessionState,
    as_operator,
    as_tool_result,
    budgets_payload,
    instruction_payload,
    stored,
    usage_cost,
    user_payload,
)
from agent_runtime.upgraders import IncompatibleSchemaError, load_state

from ..models import (
    AgentSession,
    AlertReason,
    ApiToken,
    AuditAction,
    AuditEvent,
    Checkpoint,
    Kind,
    Reason,
    Status,
    Step,
)
from ..permissions import can_operate_agent, can_operate_session, can_view_session
from ..runtime import agent_registry, agent_version, redactor
from ..sealing import exact, keep_secrets
from ..store import alerts, graph, writes
from ..web.http import status_of
from . import dispatch

log = logging.getLogger("respawn.services")

Actor = AbstractBaseUser | AnonymousUser | None


def is_person(actor: Actor) -> TypeGuard[AbstractBaseUser]:
    """A person signed in, whose teams and roles bound what they may do; otherwise the
    system (a command, a worker, a job: None), which acts on every session."""
    return actor is not None and bool(getattr(actor, "is_authenticated", False))


MAX_INPUT_CHARS = 100_000
# A reason or a note a person gives with an action (approve, reject, resolve, correct): as
# long as the API's schema allows, from every face.
MAX_REASON_CHARS = 2000


def _bounded(text: str | None, field: str) -> str:
    """A reason or note as stored: stripped; longer than MAX_REASON_CHARS is refused,
    naming the field (never cut short without a word)."""
    text = (text or "").strip()
    if len(text) > MAX_REASON_CHARS:
        raise ActionError(
            f"the {field} is {len(text):,} characters long; at most {MAX_REASON_CHARS:,}",
            code="too_long",
            field=field,
        )
    return text


class ActionError(Exception):
    """An action that does not fit: bad input, or the session's status does not allow it.
    `status` is the HTTP status every face (dashboard, API) answers it with; `field`, when
    the input of one field is wrong, names it (a form shows the message beside it)."""

    def __init__(self, message: str, *, code: str = "invalid", field: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.field = field

    @property
    def status(self) -> int:
        return status_of(self.code)


@dataclass(frozen=True)
class ActorInfo:
    user: Any
    label: str


def _actor(actor: Actor, label: str | None = None) -> ActorInfo:
    if is_person(actor):
        return ActorInfo(user=actor, label=label or actor.get_username())
    return ActorInfo(user=None, label=label or "system")


def _summary(session: AgentSession) -> dict[str, Any]:
    return {
        "status": session.status,
        "head": session.head,
        "last_seq": session.last_seq,
        "fencing_token": session.fencing_token,
    }


def audit(
    *,
    actor: ActorInfo,
    action: AuditAction,
    session: AgentSession | None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    request_meta: dict[str, Any] | None = None,
) -> AuditEvent:
    clean = redactor().redact
    return AuditEvent.objects.create(
        actor=actor.user,
        actor_label=actor.label,
        action=AuditAction(action).value,  # ValueError for an action no one declared
        session=session,
        before=clean(before or {}),
        after=clean(after or {}),
        request_meta=request_meta or {},
    )


def _locked(session_id: Any, actor: Any = None) -> AgentSession:
    """The session row, locked for this transaction, for `actor` to change (a person:
    ActionError unless they may act on it; None: the system). On PostgreSQL the wait for
    it is bounded (RESPAWN_LOCK_WAIT): a worker stopped inside a tool's fenced write holds
    the row, and a request must not hang on it (nor hold a web thread): "busy", try
    again."""
    session = _locked_row_of(session_id)
    if is_person(actor):
        if not can_view_session(actor, session):
            # Another team's session does not exist for them (not a 403 that confirms it).
            raise ActionError(f"no session with id {session_id}", code="not_found")
        if not can_operate_session(actor, session):
            raise ActionError(
                "your role does not act on this session (its team's viewer)", code="forbidden"
            )
    return session


def _locked_row_of(session_id: Any) -> AgentSession:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT set_config('lock_timeout', %s, true)",
                [f"{int(settings.RESPAWN_LOCK_WAIT * 1000)}ms"],
            )
    try:
        return AgentSession.objects.select_for_update().get(id=session_id)
    except OperationalError as exc:
        if getattr(getattr(exc, "__cause__", None), "sqlstate", None) != "55P03":
            raise
        raise ActionError(
            "the session is busy: a worker is writing a tool's result on it (or is stopped"
            " inside that write); nothing was changed, try again in a moment",
            code="busy",
        ) from None
    except AgentSession.DoesNotExist:
        raise ActionError(f"no session with id {session_id}", code="not_found") from None
    except (ValueError, TypeError):
        raise ActionError(f"not a session id: {session_id!r}", code="not_found") from None


def refuse_foreign_agent(actor: Actor, agent: str) -> None:
    """A person may start (or import) a session only of an agent they act on: one of their
    teams' agents, or any with a global operator role."""
    if is_person(actor):
        if not can_operate_agent(actor, agent):
            raise ActionError(
                f"agent {agent!r} is not one your teams act on: start sessions of your "
                "teams' agents",
                code="forbidden",
                field="agent",
            )


def _refuse(refusal: tuple[str, str] | None) -> None:
    """Raise the model's refusal of an action (AgentSession.*_refusal), if it has one."""
    if refusal is not None:
        message, code = refusal
        raise ActionError(message, code=code)


def model_usage_cost(step: Step) -> Decimal:
    """What a stored model step cost (0 for any other step)."""
    if step.kind != Kind.MODEL:
        return Decimal(0)
    return Decimal(str(usage_cost(step.payload)))


def _load_checkpoint_state(checkpoint: Checkpoint) -> SessionState:
    """A stored checkpoint's state, through the upgraders; ActionError if it cannot load."""
    try:
        return load_state(exact(checkpoint.state)).value
    except IncompatibleSchemaError as exc:
        raise ActionError(
            f"checkpoint at seq {checkpoint.seq} cannot be loaded by this code: {exc}",
            code="incompatible",
        ) from None


def _head_state(session: AgentSession) -> SessionState | None:
    """The state of the checkpoint a resume would load; None if the session has none."""
    checkpoint = session.head_checkpoint()
    return _load_checkpoint_state(checkpoint) if checkpoint else None


def _resume_point(session: AgentSession, checkpoint_seq: int) -> Checkpoint:
    """The checkpoint a rollback or a fork goes back to: the latest one at that seq that
    is not a before-rollback copy."""
    target = (
        Checkpoint.objects.filter(session=session, seq=checkpoint_seq)
        .exclude(reason=Reason.BEFORE_ROLLBACK)
        .order_by("-id")
        .first()
    )
    if target is None:
        raise ActionError(f"session has no checkpoint at seq {checkpoint_seq}", code="not_found")
    return target


def _clear_incompatible(session: AgentSession) -> None:
    session.incompatible_reason = ""
    session.incompatible_at = None
    session.incompatible_code_schema = None
    session.incompatible_agent_version = ""


def _append_operator_step(
    session: AgentSession, payload: dict[str, Any], kind: str = Kind.OPERATOR
) -> int:
    """A step a person's action writes outside any run, through the store (which fences
    whoever held the lease off); returns its seq. The run reads it back: a secret in it is
    sealed by the column, not rewritten (sessions_app.sealing)."""
    return writes.append_operator_step(session, kind, payload)


@dataclass(frozen=True)
class _Edit:
    """What an operator's edit writes: its step, the session's new status and error, and
    what the audit event records beside the session's summary."""

    payload: dict[str, Any]
    kind: str = Kind.OPERATOR
    status: str = Status.QUEUED
    last_error: str = ""
    clear_final_answer: bool = False
    before: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)


def _operator_edit(
    session_id: Any,
    action: AuditAction,
    prepare: Callable[[AgentSession, ActorInfo], _Edit],
    actor: Actor,
    request_meta: dict | None,
) -> AgentSession:
    """What every edit that appends a step outside a run does. Under the session's lock,
    `prepare` checks the session (raising ActionError) and says what to write; the step is
    appended, the session saved and audited and, when the edit queues it, dispatched once
    the transaction commits."""
    who = _actor(actor)
    with transaction.atomic():
        session = _locked(session_id, who.user)
        edit = prepare(session, who)
        before = {**_summary(session), **edit.before}
        seq = _append_operator_step(session, edit.payload, kind=edit.kind)
        session.status = edit.status
        session.last_error = edit.last_error
        if edit.clear_final_answer:
            session.final_answer = ""
        session.save()
        audit(
            actor=who,
            action=action,
            session=session,
            before=before,
            after={**_summary(session), "step": seq, **edit.after},
            request_meta=request_meta,
        )
        if session.status == Status.QUEUED:
            dispatch.dispatch_on_commit(session)
    return session


# --- Budgets -----------------------------------------------------------------------------

BUDGET_FIELDS = (*STATE_BUDGETS, "max_seconds")
# Which budgets may be lifted altogether (None); a step limit always stays.
LIFTABLE = ("max_tokens", "max_cost", "max_seconds")


def parse_budgets(raw: Any) -> dict[str, Any]:
    """Budgets from a client: {max_steps, max_tokens, max_cost, max_seconds}, each
    optional; None lifts a token, cost or time limit. ActionError names a bad one."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ActionError(f"budgets must be an object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(BUDGET_FIELDS))
    if unknown:
        raise ActionError(
            f"unknown budget(s) {', '.join(unknown)} (known: {', '.join(BUDGET_FIELDS)})"
        )
    out: dict[str, Any] = {}
    for name, value in raw.items():
        if value is None:
            if name not in LIFTABLE:
                raise ActionError(
                    f"budgets.{name}: a step limit is required (a positive integer)", field=name
                )
            out[name] = None
            continue
        whole = name in ("max_steps", "max_tokens")
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or value <= 0 or (whole and not isinstance(value, int)) or value != value:
            kind = "a positive integer" if whole else "a positive number"
            raise ActionError(f"budgets.{name}: expected {kind}, got {value!r}", field=name)
        if value > 10**12:
            raise ActionError(f"budgets.{name}: {value!r} is too large", field=name)
        out[name] = value if whole else float(value)
    return out


def session_set_budgets(
    *,
    session_id: Any,
    budgets: Any,
    resume: bool = True,
    actor: Actor = None,
    request_meta: dict | None = None,
) -> AgentSession:
    """Change a session's budgets (raise them, most often, after one paused it): an
    operator step the next run folds into its state, and the session row's deadline for
    max_seconds (wall time counted from the session's start). With `resume`, a paused or
    failed session is queued to continue."""
    changes = parse_budgets(budgets)
    if not changes:
        raise ActionError("no budgets given (max_steps, max_tokens, max_cost, max_seconds)")

    def prepare(session: AgentSession, who: ActorInfo) -> _Edit:
        _refuse(session.budgets_refusal())
        payload = budgets_payload(changes, who.label)
        before: dict[str, Any] = {}
        after: dict[str, Any] = {"budgets": changes}
        if "max_seconds" in changes:
            seconds = changes["max_seconds"]
            deadline = None if seconds is None else session.created_at + timedelta(seconds=seconds)
            if deadline is not None and deadline <= timezone.now():
                raise ActionError(
                    f"budgets.max_seconds: {seconds:g} s from the session's start "
                    f"({session.created_at:%Y-%m-%d %H:%M:%S} UTC) has already passed; "
                    "give a longer wall time",
                )
            before["deadline_at"] = session.deadline_at.isoformat() if session.deadline_at else None
            session.deadline_at = deadline
            after["deadline_at"] = deadline.isoformat() if deadline else None
            payload = stored(as_operator(payload) | OperatorPayload(deadline=after["deadline_at"]))
        queue = resume and session.budgets_resume()
        return _Edit(
            payload=payload,
            status=Status.QUEUED if queue else session.status,
            last_error="" if queue else session.last_error,
            before=before,
            after=after,
        )

    return _operator_edit(session_id, AuditAction.SET_BUDGETS, prepare, actor, request_meta)


def session_start(
    *,
    agent: str,
    input: str,
    title: str = "",
    budgets: Any = None,
    actor: Actor = None,
    request_meta: dict[str, Any] | None = None,
) -> AgentSession:
    """Create a session with its first user step and queue it for a worker. `budgets`
    (parse_budgets) replace the agent's limits for this session."""
    agent = (agent or "").strip()
    try:
        definition = agent_registry().get(agent)
    except UnknownAgent:
        known = ", ".join(agent_registry().names())
        raise ActionError(
            f"unknown agent {agent!r} (known: {known})", code="unknown_agent", field="agent"
        ) from None
    refuse_foreign_agent(actor, agent)
    text = (input or "").strip()
    if not text:
        raise ActionError("input must not be empty", code="empty_input", field="input")
    if len(text) > MAX_INPUT_CHARS:
        raise ActionError(
            f"input is longer than {MAX_INPUT_CHARS} characters", code="too_long", field="input"
        )
    limits = parse_budgets(budgets)
    who = _actor(actor)
    now = timezone.now()
    seconds = limits.get("max_seconds", definition.limits.max_seconds)
    state_budgets = {k: v for k, v in limits.items() if k in STATE_BUDGETS}
    steps = [(Kind.USER, user_payload(text))]
    if state_budgets:
        # The session's own limits, folded into its state by its first run.
        steps.append((Kind.OPERATOR, budgets_payload(state_budgets, who.label, "set at start")))
    with transaction.atomic():
        session = writes.new_session(
            [writes.NewRow(kind, payload) for kind, payload in steps],
            now=now,
            agent=agent,
            agent_version=definition.version,
            title=redactor().text(title or text)[:300],
            status=Status.QUEUED,
            created_by=who.user,
            deadline_at=now + timedelta(seconds=seconds) if seconds else None,
        )
        audit(
            actor=who,
            action=AuditAction.START,
            session=session,
            after={**_summary(session), **({"budgets": limits} if limits else {})},
            request_meta=request_meta,
        )
        dispatch.dispatch_on_commit(session)
    return session


def session_resume(
    *,
    session_id: Any,
    actor: Actor = None,
    request_meta: dict | None = None,
    dispatch_now: bool = True,
) -> AgentSession:
    """Queue a paused, failed or stuck session to continue from its head. An incompatible
    mark is cleared: the next run loads it again, and marks it again if it still cannot.

    dispatch_now=False leaves the enqueue to the reconciler, which dispatches at most
    RESPAWN_RECONCILE_BATCH sessions per pass: how bulk resumes are throttled."""
    who = _actor(actor)
    with transaction.atomic():
        session = _locked(session_id, who.user)
        _refuse(session.resume_refusal())
        before = _summary(session)
        session.status = Status.QUEUED
        session.last_error = ""
        writes.fence(session)
        session.updated_at = timezone.now()
        _clear_incompatible(session)
        session.save(
            update_fields=[
                "status",
                "last_error",
                *writes.FENCE_FIELDS,
                "updated_at",
                "incompatible_reason",
                "incompatible_at",
                "incompatible_code_schema",
                "incompatible_agent_version",
            ]
        )
        audit(
            actor=who,
            action=AuditAction.RESUME,
            session=session,
            before=before,
            after=_summary(session),
            request_meta=request_meta,
        )
        if dispatch_now:
            dispatch.dispatch_on_commit(session)
        else:
            AgentSession.objects.filter(id=session.id).update(dispatched_at=None, job_id="")
    return session


BULK_DISPATCH_NOW = 50  # a bulk resume enqueues this many at once; the reconciler the rest


def session_resume_in_bulk(
    *, session_id: Any, position: int, actor: Actor = None, request_meta: dict | None = None
) -> str:
    """Resume the session at `position` (from 0) of a bulk selection: the first
    BULK_DISPATCH_NOW are enqueued now, the reconciler dispatches the rest in waves.
    Returns what became of it, for the operator's report."""
    now = position < BULK_DISPATCH_NOW
    session_resume(session_id=session_id, actor=actor, request_meta=request_meta, dispatch_now=now)
    return "queued" if now else "queued (dispatched by the reconciler)"


def session_cancel(
    *, session_id: Any, actor: Actor = None, request_meta: dict | None = None
) -> AgentSession:
    """Cancel a session at once, running or not. The cancel step bumps the fencing token,
    so a worker in the middle of a step cannot write anything after it: its next write is
    refused and it stops (a tool already running finishes, its result is not recorded)."""
    who = _actor(actor)
    with transaction.atomic():
        session = _locked(session_id, who.user)
        _refuse(session.cancel_refusal())
        before = _summary(session)
        was_running = session.has_live_worker()
        _append_operator_step(
            session,
            stored(
                OperatorPayload(
                    action=OperatorAction.CANCEL, actor=who.label, while_running=was_running
                )
            ),
        )
        session.status = Status.CANCELLED
        session.cancel_requested = False
        session.save()
        audit(
            actor=who,
            action=AuditAction.CANCEL,
            session=session,
            before=before,
            after=_summary(session),
            request_meta=request_meta,
        )
    return session


def _decide(
    session_id: Any, decision: AuditAction, actor: Actor, reason: str, request_meta: dict | None
) -> AgentSession:
    who = _actor(actor)
    with transaction.atomic():
        session = _locked(session_id, who.user)
        _refuse(session.decision_refusal())
        state = _head_state(session)
        pending = state.pending_approval if state else None
        if pending is None:
            raise ActionError("nothing is waiting for approval in this session", code="bad_status")
        reason = _bounded(reason, "reason")
        if decision == AuditAction.REJECT and not reason:
            raise ActionError(
                "say why the call is rejected: the model is told the reason", code="empty_input"
            )
        before = _summary(session)
        payload = OperatorPayload(
            action=OperatorAction(decision),
            call_id=pending.call_id,
            tool=pending.tool,
            actor=who.label,
        )
        if reason:
            payload["reason"] = reason
        _append_operator_step(session, stored(payload))
        session.status = Status.QUEUED
        session.save()
        audit(
            actor=who,
            action=decision,
            session=session,
            before={**before, "pending": {"call_id": pending.call_id, "tool": pending.tool}},
            after=_summary(session),
            request_meta=request_meta,
        )
        dispatch.dispatch_on_commit(session)
    return session


def session_approve(
    *, session_id: Any, actor: Actor = None, reason: str = "", request_meta: dict | None = None
) -> AgentSession:
    return _decide(session_id, AuditAction.APPROVE, actor, reason, request_meta)


def session_reject(
    *, session_id: Any, actor: Actor = None, reason: str = "", request_meta: dict | None = None
) -> AgentSession:
    return _decide(session_id, AuditAction.REJECT, actor, reason, request_meta)


def checkpoint_rollback(
    *, session_id: Any, checkpoint_seq: int, actor: Actor = None, request_meta: dict | None = None
) -> AgentSession:
    """Make checkpoint `checkpoint_seq` the head again. Later steps are marked superseded
    (never deleted), the state before is kept as a `before-rollback` checkpoint, and the
    session waits, paused, until someone resumes it."""
    who = _actor(actor)
    with transaction.atomic():
        session = _locked(session_id, who.user)
        _refuse(session.rollback_refusal())
        target = _resume_point(session, checkpoint_seq)
        target_state = _load_checkpoint_state(target)
        before = _summary(session)
        current = session.head_checkpoint()
        now = timezone.now()
        if current is not None:
            # A copy of what was there, kept in the version it was stored in.
            writes.add_checkpoint(
                session,
                current.state,
                reason=Reason.BEFORE_ROLLBACK,
                schema_version=current.schema_version,
                now=now,
            )
        superseded = writes.supersede_after(session, checkpoint_seq, now=now)
        step = _append_operator_step(
            session,
            stored(
                OperatorPayload(
                    action=OperatorAction.ROLLBACK,
                    actor=who.label,
                    checkpoint_seq=checkpoint_seq,
                    superseded_steps=superseded,
                )
            ),
        )
        # The rollback record itself is history after the checkpoint; it stays visible.
        session.head = checkpoint_seq
        session.status = Status.PAUSED
        session.final_answer = target_state.final_answer or ""
        cursor = target_state.batch_cursor or {}
        session.progress_done, session.progress_total = cursor.get("done"), cursor.get("total")
        session.save()
        audit(
            actor=who,
            action=AuditAction.ROLLBACK,
            session=session,
            before=before,
            after={**_summary(session), "superseded_steps": superseded, "operator_step": step},
            request_meta=request_meta,
        )
    return session


def api_token_used(*, token: ApiToken) -> None:
    """Note that a token authenticated a request now (the admin lists its last use)."""
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())


def session_mark_incompatible(*, session_id: Any, reason: str) -> bool:
    """Record that this code cannot load the session (the run refused it and wrote nothing).

    Only the mark is written: no step, no checkpoint, no status change. The reconciler
    leaves the session alone until code with a newer SCHEMA_VERSION, or another version
    of the session's agent, runs it."""
    agent = AgentSession.objects.filter(id=session_id).values_list("agent", flat=True).first()
    with transaction.atomic():
        marked = AgentSession.objects.filter(id=session_id).update(
            incompatible_reason=reason,
            incompatible_at=timezone.now(),
            incompatible_code_schema=SCHEMA_VERSION,
            incompatible_agent_version=agent_version(agent) if agent is not None else "",
        )
        if marked and agent is not None and alerts.rules_exist():
            # The alert's outbox rows commit with the mark (sessions_app.store.alerts).
            alerts.raise_alert(session_id, AlertReason.INCOMPATIBLE, agent=agent, detail=reason)
    log.warning("session %s is incompatible with this code: %s", session_id, reason)
    return bool(marked)


def session_clear_incompatible(*, session_id: Any) -> bool:
    """Clear the mark of a session that loads again (after upgrade_state, for instance)."""
    return bool(
        AgentSession.objects.filter(id=session_id, incompatible_at__isnull=False).update(
            incompatible_reason="",
            incompatible_at=None,
            incompatible_code_schema=None,
            incompatible_agent_version="",
        )
    )


def session_send_message(
    *, session_id: Any, content: str, actor: Actor = None, request_meta: dict | None = None
) -> AgentSession:
    """Continue a conversation: append a user step and queue the session."""
    text = (content or "").strip()
    if not text:
        raise ActionError("content must not be empty", code="empty_input")
    if len(text) > MAX_INPUT_CHARS:
        raise ActionError(f"content is longer than {MAX_INPUT_CHARS} characters", code="too_long")

    def prepare(session: AgentSession, who: ActorInfo) -> _Edit:
        _refuse(session.message_refusal())
        return _Edit(payload=user_payload(text), kind=Kind.USER, clear_final_answer=True)

    return _operator_edit(session_id, AuditAction.MESSAGE, prepare, actor, request_meta)


def session_fork(
    *, session_id: Any, checkpoint_seq: int, actor: Actor = None, request_meta: dict | None = None
) -> AgentSession:
    """A new session whose history is the parent's live history up to checkpoint K
    (copied, renumbered 1..N), with K's state as its head. It starts paused: resume it or
    send it a message."""
    who = _actor(actor)
    with transaction.atomic():
        parent = _locked(session_id, who.user)
        target = _resume_point(parent, checkpoint_seq)
        steps = list(
            Step.objects.filter(
                session=parent, seq__lte=checkpoint_seq, superseded_at__isnull=True
            ).order_by("seq")
        )
        # Read as a worker reads it: through the upgraders (an old checkpoint's blob does not
        # have the current shape), refused if this code cannot load it.
        state = _load_checkpoint_state(target)
        cursor = state.batch_cursor or {}
        now = timezone.now()
        fork = writes.new_session(
            # Copies keep their keys: those effects happened under them.
            [writes.NewRow.copy_of(s) for s in steps],
            now=now,
            agent=parent.agent,
            # The fork continues the parent's history: it started where the parent did.
            agent_version=parent.agent_version,
            title=f"Fork of {parent.title or parent.id}"[:300],
            status=Status.PAUSED,
            created_by=who.user,
            parent=parent,
            fork_seq=checkpoint_seq,
            head=len(steps),
            cost=sum(model_usage_cost(s) for s in steps),
            final_answer=state.final_answer or "",
            progress_done=cursor.get("done"),
            progress_total=cursor.get("total"),
        )
        if parent.graph_thread_or_none() is not None:
            seq_map = {s.seq: index for index, s in enumerate(steps, start=1)}
            graph.copy_graph_rows(parent=parent, fork=fork, seq_map=seq_map)
        writes.add_checkpoint(
            fork,
            target.state,
            seq=len(steps),
            reason=Reason.MANUAL,
            schema_version=target.schema_version,
            now=now,
        )
        audit(
            actor=who,
            action=AuditAction.FORK,
            session=fork,
            before={"parent": str(parent.id), "checkpoint_seq": checkpoint_seq},
            after=_summary(fork),
            request_meta=request_meta,
        )
        audit(
            actor=who,
            action=AuditAction.FORKED,
            session=parent,
            after={"fork": str(fork.id), "checkpoint_seq": checkpoint_seq},
            request_meta=request_meta,
        )
    return fork


def session_correct_result(
    *,
    session_id: Any,
    result_seq: int,
    output: Any,
    note: str = "",
    actor: Actor = None,
    request_meta: dict | None = None,
) -> AgentSession:
    """Edit and resume: replace what a tool returned. The original result stays in the
    trace; an `operator` step records the correction, and the model sees the corrected
    value labelled as an operator's. Then the session is queued to continue."""
    import json

    try:
        json.dumps(output)
    except (TypeError, ValueError):
        raise ActionError("the corrected output must be JSON", code="invalid") from None

    def prepare(session: AgentSession, who: ActorInfo) -> _Edit:
        _refuse(session.edit_refusal())
        target = Step.objects.filter(
            session=session, seq=result_seq, superseded_at__isnull=True
        ).first()
        if target is None or target.kind != Kind.TOOL_RESULT:
            raise ActionError(
                f"step {result_seq} is not a live tool result of this session", code="not_found"
            )
        shown = target.payload
        original = as_tool_result(exact(shown))
        if isinstance(shown, dict) and "output" in shown:
            # Corrected on the masked output (the form starts from it): what was left as
            # shown keeps its exact value.
            corrected = keep_secrets({**shown, "output": output}, shown)["output"]
        else:
            corrected = output
        payload = OperatorPayload(
            action=OperatorAction.CORRECT_RESULT,
            actor=who.label,
            call_id=original["call_id"],
            name=original["name"],
            result_seq=result_seq,
            output=corrected,
        )
        if said := _bounded(note, "note"):
            payload["note"] = said
        return _Edit(
            payload=stored(payload),
            before={"result_seq": result_seq, "original": target.payload},
            after={"output": corrected},
        )

    return _operator_edit(session_id, AuditAction.CORRECT_RESULT, prepare, actor, request_meta)


def session_add_instruction(
    *, session_id: Any, text: str, actor: Actor = None, request_meta: dict | None = None
) -> AgentSession:
    """Edit and resume: give the agent an operator's instruction (marked as such), then
    queue it to continue."""
    text = (text or "").strip()
    if not text:
        raise ActionError("the instruction must not be empty", code="empty_input")
    if len(text) > MAX_INPUT_CHARS:
        raise ActionError(
            f"the instruction is longer than {MAX_INPUT_CHARS} characters", code="too_long"
        )

    def prepare(session: AgentSession, who: ActorInfo) -> _Edit:
        _refuse(session.edit_refusal())
        return _Edit(payload=instruction_payload(text, who.label), after={"text": text})

    return _operator_edit(session_id, AuditAction.INSTRUCTION, prepare, actor, request_meta)


UNCERTAIN_CHOICES = (OperatorAction.RERUN, OperatorAction.RECORD_RESULT, OperatorAction.FAIL)
UNCERTAIN_AUDIT: dict[str, AuditAction] = {
    OperatorAction.RERUN: AuditAction.UNCERTAIN_RERUN,
    OperatorAction.RECORD_RESULT: AuditAction.UNCERTAIN_RECORD_RESULT,
    OperatorAction.FAIL: AuditAction.UNCERTAIN_FAIL,
}


def session_resolve_uncertain(
    *,
    session_id: Any,
    resolution: str,
    output: Any = None,
    note: str = "",
    actor: Actor = None,
    request_meta: dict | None = None,
) -> AgentSession:
    """A person's decision on a non-idempotent tool call that a crash left without a
    result: `rerun` (it did not happen: run it again, same key), `record_result` (it did
    happen: here is what it returned), or `fail` the session."""
    import json

    if resolution not in UNCERTAIN_CHOICES:
        raise ActionError(
            f"resolution must be one of {', '.join(UNCERTAIN_CHOICES)}, got {resolution!r}",
            code="invalid",
        )
    if resolution == OperatorAction.RECORD_RESULT:
        try:
            json.dumps(output)
        except (TypeError, ValueError):
            raise ActionError("the recorded result must be JSON", code="invalid") from None

    def prepare(session: AgentSession, who: ActorInfo) -> _Edit:
        state = _head_state(session)
        uncertain = list(state.uncertain_calls) if state else []
        if not session.can_decide() or not uncertain:
            raise ActionError("no tool call of this session is uncertain", code="bad_status")
        call_id = uncertain[0]
        payload = OperatorPayload(action=resolution, call_id=call_id, actor=who.label)
        if resolution == OperatorAction.RECORD_RESULT:
            payload["output"] = output
        if said := _bounded(note, "note"):
            payload["note"] = said
        before = {"uncertain_call": call_id}
        if resolution == OperatorAction.FAIL:
            failed = f"failed by {who.label}: tool call {call_id} may or may not have happened"
            return _Edit(
                payload=stored(payload), status=Status.FAILED, last_error=failed, before=before
            )
        return _Edit(payload=stored(payload), before=before)

    return _operator_edit(session_id, UNCERTAIN_AUDIT[resolution], prepare, actor, request_meta)


MAX_HOLD_NOTE = 300


def session_set_legal_hold(
    *,
    session_id: Any,
    hold: bool,
    note: str = "",
    actor: Actor = None,
    request_meta: dict | None = None,
) -> AgentSession:
    """Put a session on legal hold (retention never deletes anything of it) or release it;
    audited with the note (why, which case)."""
    note = (note or "").strip()
    if len(note) > MAX_HOLD_NOTE:
        raise ActionError(f"the note is longer than {MAX_HOLD_NOTE} characters", code="too_long")
    if hold and not note:
        raise ActionError("say why the session is held (a case or ticket)", code="empty_input")
    who = _actor(actor)
    with transaction.atomic():
        session = _locked(session_id, who.user)
        before = {"legal_hold": session.legal_hold, "note": session.legal_hold_note}
        session.legal_hold = hold
        session.legal_hold_note = redactor().text(note) if hold else ""
        session.save(update_fields=["legal_hold", "legal_hold_note"])
        audit(
            actor=who,
            action=AuditAction.LEGAL_HOLD if hold else AuditAction.LEGAL_HOLD_RELEASE,
            session=session,
            before=before,
            after={"legal_hold": hold, "note": note},
            request_meta=request_meta,
        )
    return session


def session_repair_times(
    *, session_id: Any, actor: Actor = None, request_meta: dict | None = None
) -> dict[str, int]:
    """Move the times of a session's row, steps and checkpoints that no page can read
    (past the year 9999 or before the year 1 in UTC: SQL by hand, an older release's
    import) to now; audited with what moved. Returns it ({} when nothing was out of range)."""
    who = _actor(actor)
    with transaction.atomic():
        session = _locked(session_id, who.user)
        moved = writes.repair_times(session.pk, timezone.now())
        if moved:
            audit(
                actor=who,
                action=AuditAction.REPAIR_TIMES,
                session=session,
                after={"moved_to_now": moved},
                request_meta=request_meta,
            )
    return moved


def session_check_compat(
    *, session_id: Any, actor: Actor = None, request_meta: dict | None = None
) -> str:
    """Load the session as a worker would, with this code, and check it against this
    code's agents (as the deploy gate does): mark it incompatible (with the reason) if a
    worker would refuse it, clear an old mark if not. Returns the problems, or "" when
    there are none. Changes no step or checkpoint."""
    from agent_runtime.compat import REFUSALS, session_problems

    from ..store import session_store

    who = _actor(actor)
    session = AgentSession.objects.filter(id=session_id).first()
    if session is None:
        raise ActionError(f"no session with id {session_id}", code="not_found")
    try:
        head = session_store().load_head(str(session.id))
    except IncompatibleSchemaError as exc:
        problem = str(exc)
        session_mark_incompatible(session_id=session.id, reason=problem)
    else:
        # A program's own session is checked by that program (as the deploy gate leaves
        # it), once its blobs load.
        problems = [] if session.run_by_program() else session_problems(head, agent_registry())
        problem = "; ".join(f"{p.where}: {p.error}" for p in problems)
        refusals = [p for p in problems if p.where in REFUSALS]
        if refusals:
            # What a worker would refuse; a call to a tool that is gone is only a failed
            # call for the model to see, not a reason to hold the session back.
            session_mark_incompatible(
                session_id=session.id, reason="; ".join(p.error for p in refusals)
            )
        else:
            session_clear_incompatible(session_id=session.id)
    audit(
        actor=who,
        action=AuditAction.COMPAT_CHECK,
        session=session,
        after={"loads": not problem, "problem": problem, "schema_version": SCHEMA_VERSION},
        request_meta=request_meta,
    )
    return problem
