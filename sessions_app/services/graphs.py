"""Operator actions that only LangGraph sessions have, and the graph side of the common
ones. Resume, cancel and rollback are the common services (sessions_app.services.core): a
rollback supersedes the steps after checkpoint K, and a superseded checkpoint is no longer
its thread's latest, so the next run continues from K (LangGraph's time travel)."""

from __future__ import annotations

import json
from typing import Any

from django.db import transaction

from agent_runtime.state import (
    OperatorAction,
    OperatorPayload,
    PayloadField,
    SystemEvent,
    as_system,
    stored,
)

from ..models import AgentSession, AuditAction, Status, payload_q
from ..models.graph import GraphCheckpoint, GraphThread
from . import dispatch
from .core import (
    ActionError,
    Actor,
    _actor,
    _append_operator_step,
    _locked,
    _summary,
    audit,
)

MAX_ANSWER_CHARS = 100_000


def is_graph_session(session: AgentSession) -> bool:
    return (
        GraphThread.objects.filter(session=session).exists()
        or GraphCheckpoint.objects.filter(session=session).exists()
    )


def pending_interrupts(session: AgentSession) -> list[dict[str, Any]]:
    """What the graph asked (its `interrupt()` values) when its last run stopped."""
    if not session.can_decide():
        return []
    step = (
        session.steps.filter(
            payload_q(PayloadField.EVENT, value=SystemEvent.RUN_FINISHED),
            kind="system",
            superseded_at=None,
        )
        .order_by("-seq")
        .first()
    )
    if step is None:
        return []
    return list(as_system(step.payload).get("interrupts") or [])


def session_answer_interrupt(
    *, session_id: Any, value: Any, actor: Actor = None, request_meta: dict | None = None
) -> AgentSession:
    """Answer the graph's `interrupt()`: the next run resumes the graph with `value`
    (LangGraph's `Command(resume=value)`). Audited; the session is queued."""
    who = _actor(actor)
    if len(json.dumps(value, default=str)) > MAX_ANSWER_CHARS:
        raise ActionError(f"the answer is longer than {MAX_ANSWER_CHARS} characters")
    with transaction.atomic():
        session = _locked(session_id, who.user)
        if not is_graph_session(session):
            raise ActionError("this session is not a LangGraph thread", code="bad_status")
        interrupts = pending_interrupts(session)
        if not interrupts:
            raise ActionError("the graph is not waiting for an answer", code="bad_status")
        before = _summary(session)
        step = _append_operator_step(
            session,
            stored(
                OperatorPayload(
                    action=OperatorAction.ANSWER_INTERRUPT, actor=who.label, value=value
                )
            ),
        )
        session.status = Status.QUEUED
        session.save()
        audit(
            actor=who,
            action=AuditAction.ANSWER_INTERRUPT,
            session=session,
            before={**before, "interrupts": interrupts},
            after={**_summary(session), "operator_step": step},
            request_meta=request_meta,
        )
        dispatch.dispatch_on_commit(session)
    return session
