"""What the Django admin changes, as functions: each locks the session it touches, refuses
what would race a worker, and writes an AuditEvent with the full before and after values of
what it changed. The admin's session actions (resume, cancel, roll back) call `services`
directly, like the dashboard and the API."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from ..models import AgentSession, ApiToken, AuditAction, Checkpoint, Reason, Step
from ..permissions import can_administer
from ..runtime import redactor
from ..sealing import exact, keep_secrets
from ..store import writes
from ..validation import validate_checkpoint_state_json, validate_step_payload_json
from .core import (
    ActionError,
    Actor,
    ActorInfo,
    _actor,
    _locked,
    audit,
    checkpoint_rollback,
)


def _refuse_if_running(session: AgentSession) -> None:
    """A worker holding a live lease has the session's history in memory and writes on
    top of it: an edit underneath it would be overwritten in meaning, if not in bytes."""
    if session.lease_is_live():
        raise ActionError(
            "the session is running (a worker holds its lease); cancel it or wait until it "
            "stops before editing its history",
            code="already_running",
        )


Row = TypeVar("Row", Step, Checkpoint)


def _locked_row(model: type[Row], pk: int, what: str, actor: Any) -> tuple[AgentSession, Row]:
    """A step or checkpoint to edit, locked after its session (the lock a worker's append
    waits on), and refused while a worker holds the session's lease."""
    session_id = model.objects.filter(pk=pk).values_list("session_id", flat=True).first()
    if session_id is None:
        raise ActionError(f"no {what} with id {pk}", code="not_found")
    session = _locked(session_id, actor)
    _refuse_if_running(session)
    return session, model.objects.select_for_update().get(pk=pk)


def _fence(session: AgentSession) -> tuple[int, int]:
    """Fence the session: a worker whose lease expired but who has not noticed yet cannot
    write after an edit of the history it loaded."""
    return writes.fence_now(session)


def _refuse_unless_own_or_admin(who: ActorInfo, user: Any, what: str) -> None:
    if who.user is not None and user.pk != who.user.pk and not can_administer(who.user):
        raise ActionError(f"only admins {what} for other users", code="forbidden")


def _invalid(exc: ValidationError) -> ActionError:
    return ActionError(" ".join(exc.messages), code="invalid")


def session_edit_title(
    *, session_id: Any, title: str, actor: Actor = None, request_meta: dict | None = None
) -> AgentSession:
    """Rename a session. Only the title column is written, so nothing a worker is
    writing at the same time is overwritten."""
    who = _actor(actor)
    with transaction.atomic():
        session = _locked(session_id, who.user)
        new = redactor().text((title or "").strip())[:300]
        if new == session.title:
            return session
        before = {"title": session.title}
        session.title = new
        session.save(update_fields=["title"])
        audit(
            actor=who,
            action=AuditAction.ADMIN_EDIT_SESSION,
            session=session,
            before=before,
            after={"title": new},
            request_meta=request_meta,
        )
    return session


def step_edit_payload(
    *, step_id: int, payload: Any, actor: Actor = None, request_meta: dict | None = None
) -> Step:
    """Replace a step's payload in place (what "fix a record by hand" means). The payload
    must load at the step's schema version; the audit event keeps the old one whole."""
    who = _actor(actor)
    with transaction.atomic():
        session, step = _locked_row(Step, step_id, "step", who.user)
        try:
            validate_step_payload_json(step.kind, payload, step.schema_version)
        except ValidationError as exc:
            raise _invalid(exc) from None
        # Edited on the masked view: what was left as shown keeps its exact value.
        payload = keep_secrets(payload, step.payload)
        if payload == exact(step.payload):
            return step
        where = {"step": step.seq, "kind": step.kind, "schema_version": step.schema_version}
        before = {**where, "payload": step.payload}
        writes.edit_step_payload(step, payload)
        token_before, token_after = _fence(session)
        audit(
            actor=who,
            action=AuditAction.ADMIN_EDIT_STEP,
            session=session,
            before={**before, "fencing_token": token_before},
            after={**where, "payload": payload, "fencing_token": token_after},
            request_meta=request_meta,
        )
    return step


def _head_checkpoint_id(session: AgentSession) -> int | None:
    # The checkpoint a resume loads (the same choice as the store's load_head).
    return session.head_checkpoints().values_list("id", flat=True).first()


def checkpoint_edit_state(
    *, checkpoint_id: int, state: Any, actor: Actor = None, request_meta: dict | None = None
) -> Checkpoint:
    """Replace a checkpoint's state in place. The state must load through the upgraders
    at the checkpoint's schema version. Editing the head checkpoint's final answer also
    updates the session's copy of it, as a rollback does."""
    who = _actor(actor)
    with transaction.atomic():
        session, checkpoint = _locked_row(Checkpoint, checkpoint_id, "checkpoint", who.user)
        try:
            validate_checkpoint_state_json(state, checkpoint.schema_version)
        except ValidationError as exc:
            raise _invalid(exc) from None
        state = keep_secrets(state, checkpoint.state)
        if state == exact(checkpoint.state):
            return checkpoint
        where = {"checkpoint": checkpoint.seq, "reason": checkpoint.reason}
        before: dict[str, Any] = {**where, "state": checkpoint.state}
        after: dict[str, Any] = {**where, "state": state}
        writes.edit_checkpoint_state(checkpoint, state)
        if _head_checkpoint_id(session) == checkpoint.pk:
            answer = state.get("final_answer") or ""
            if answer != session.final_answer:
                before["session_final_answer"] = session.final_answer
                after["session_final_answer"] = answer
                session.final_answer = answer
                session.save(update_fields=["final_answer"])
        before["fencing_token"], after["fencing_token"] = _fence(session)
        audit(
            actor=who,
            action=AuditAction.ADMIN_EDIT_CHECKPOINT,
            session=session,
            before=before,
            after=after,
            request_meta=request_meta,
        )
    return checkpoint


def session_rollback_to_latest(
    *, session_id: Any, actor: Actor = None, request_meta: dict | None = None
) -> tuple[AgentSession, int]:
    """Roll back to the latest checkpoint at or before the head that is not a
    `before-rollback` record; returns the session and the seq rolled back to."""
    with transaction.atomic():
        session = _locked(session_id, actor)
        seq = (
            Checkpoint.objects.filter(session=session, seq__lte=session.head)
            .exclude(reason=Reason.BEFORE_ROLLBACK)
            .order_by("-seq", "-id")
            .values_list("seq", flat=True)
            .first()
        )
        if seq is None:
            raise ActionError("the session has no checkpoint to roll back to", code="not_found")
        session = checkpoint_rollback(
            session_id=session.id, checkpoint_seq=seq, actor=actor, request_meta=request_meta
        )
    return session, seq


def api_token_issue(
    *, user: Any, name: str = "", actor: Actor = None, request_meta: dict | None = None
) -> tuple[ApiToken, str]:
    """A new API token for `user`; returns it with the raw secret, which is stored nowhere
    (not in the token row, not in the audit event). A token acts with its user's role, so
    only admins issue tokens for someone else."""
    who = _actor(actor)
    token_name(name)
    _refuse_unless_own_or_admin(who, user, "issue API tokens")
    with transaction.atomic():
        token, raw = ApiToken.issue(user, name)
        audit(
            actor=who,
            action=AuditAction.ADMIN_ISSUE_TOKEN,
            session=None,
            after={
                "token": token.pk,
                "user": user.get_username(),
                "name": token.name,
                "key_prefix": token.key_prefix,
            },
            request_meta=request_meta,
        )
    return token, raw


def token_name(name: str) -> str:
    """A token's name as given, or ActionError naming what is wrong with it (never cut
    short without a word)."""
    limit = ApiToken._meta.get_field("name").max_length or 0
    if len(name) > limit:
        raise ActionError(f"name: at most {limit} characters ({len(name)} given)", field="name")
    return name


def api_token_revoke(
    *, token_id: int, actor: Actor = None, request_meta: dict | None = None
) -> ApiToken:
    def refuse_unless_allowed(who: ActorInfo, token: ApiToken | None) -> ApiToken:
        if token is None:
            raise ActionError(f"no API token with id {token_id}", code="not_found")
        _refuse_unless_own_or_admin(who, token.user, "revoke API tokens")
        return token

    return revoke_token(
        token_id,
        allowed=refuse_unless_allowed,
        action=AuditAction.ADMIN_REVOKE_TOKEN,
        actor=actor,
        request_meta=request_meta,
    )


def revoke_token(
    token_id: int,
    *,
    allowed: Callable[[ActorInfo, ApiToken | None], ApiToken],
    action: AuditAction,
    actor: Actor = None,
    request_meta: dict | None = None,
) -> ApiToken:
    """Revoke token `token_id` (locked for the change) once `allowed`, the face's rule
    (its permission check, and what counts as not found: it raises ActionError or returns
    the token), passed; audited as `action`, with the token's team when it has one."""
    who = _actor(actor)
    with transaction.atomic():
        found = (
            ApiToken.objects.select_for_update(of=("self",))
            .select_related("user", "team")
            .filter(pk=token_id)
            .first()
        )
        token = allowed(who, found)
        if token.revoked_at is not None:
            raise ActionError("the token is already revoked", code="bad_status")
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        where = {"token": token.pk, "user": token.user.get_username(), "name": token.name}
        if token.team is not None:
            where["team"] = token.team.slug
        audit(
            actor=who,
            action=action,
            session=None,
            before={**where, "revoked_at": None},
            after={**where, "revoked_at": token.revoked_at.isoformat()},
            request_meta=request_meta,
        )
    return token
