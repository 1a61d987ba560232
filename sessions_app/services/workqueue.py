"""The work queue: who owns a session, and people's notes on it.

A person takes a session (it is theirs until they hand it on or put it back), hands it to
another operator, or puts it back in the queue; anyone who may act leaves plain-text notes
on it. Every change is audited, so the audit log is the session's assignment history.

Two people acting on one session see who owns it before they act, and an action taken on
what someone saw cannot overrule what happened since: each change names the owner its
caller saw (`seen_owner`, "" for nobody), and is refused (409 `owner_changed`) when the
owner is no longer that one. Taking a session someone else owns is a take-over: it is
only done when the caller saw that owner (a stale form never steals a session)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from ..models import AgentSession, AuditAction, SessionNote
from ..permissions import can_operate, can_operate_session
from ..runtime import redactor
from ..validation import InvalidInput, check_text
from .core import ActionError, Actor, ActorInfo, _actor, _bounded, _locked, audit

MAX_USERNAME = 150  # django.contrib.auth's username column


def owner_name(session: AgentSession) -> str:
    """The username of the session's owner, "" when nobody owns it."""
    return session.owner.get_username() if session.owner_id and session.owner else ""


def _ownership(session: AgentSession) -> dict[str, Any]:
    return {
        "owner": owner_name(session) or None,
        "owned_since": session.owned_since.isoformat() if session.owned_since else None,
    }


def _person(who: ActorInfo, what: str) -> None:
    if who.user is None:
        raise ActionError(f"only a person (a signed-in user) can {what}", code="forbidden")


def _check_seen(session: AgentSession, seen_owner: str | None) -> None:
    """Refuse the change unless the session's owner is still the one the caller saw."""
    seen = (seen_owner or "").strip()
    current = owner_name(session)
    if current == seen:
        return
    now = f"{current} owns it now" if current else "nobody owns it now"
    if current and session.owned_since:
        now += f" (since {session.owned_since:%Y-%m-%d %H:%M} UTC)"
    saw = f"owned by {seen[:MAX_USERNAME]}" if seen else "unassigned"
    raise ActionError(
        f"the owner changed: you saw this session {saw}, {now}. Nothing was changed; "
        "look again before you act.",
        code="owner_changed",
        field="seen_owner",
    )


def _operator_named(username: str) -> Any:
    """The active user called `username` who may act on sessions (ActionError otherwise,
    naming the field `to`)."""
    name = username.strip()
    try:
        check_text(name, "to", multiline=False)
    except InvalidInput as exc:
        raise ActionError(str(exc), field="to") from None
    user = get_user_model().objects.filter(username=name[:MAX_USERNAME]).first()
    if user is None or len(name) > MAX_USERNAME:
        raise ActionError(f"no user named {name[:80]!r}", code="not_found", field="to")
    if not can_operate(user):
        # What the data says, not a malformed request: a conflict with that user's role.
        raise ActionError(
            f"{name} cannot act on sessions (not an operator): a session is handed to "
            "someone who can",
            code="bad_status",
            field="to",
        )
    return user


def _set_owner(session: AgentSession, user: Any) -> None:
    session.owner = user
    session.owned_since = timezone.now() if user is not None else None
    # Only these columns: the owner is not activity (the list's "latest activity" and the
    # attention page's waiting time stay as they are).
    session.save(update_fields=["owner", "owned_since"])


def session_take(
    *,
    session_id: Any,
    seen_owner: str | None = "",
    actor: Actor = None,
    request_meta: dict | None = None,
) -> AgentSession:
    """Make the session the actor's ("assigned to me"). `seen_owner` is the owner the
    actor saw ("": nobody): taking a session someone else owns is a take-over, done only
    when it still is that one's. Already the actor's: nothing changes (not audited)."""
    who = _actor(actor)
    _person(who, "take a session")
    if not can_operate(who.user):
        raise ActionError("only operators can take sessions", code="forbidden")
    with transaction.atomic():
        session = _locked(session_id, who.user)
        if session.owner_id == who.user.pk:
            return session
        _check_seen(session, seen_owner)
        before = _ownership(session)
        action = AuditAction.TAKE_OVER if session.owner_id else AuditAction.TAKE
        _set_owner(session, who.user)
        audit(
            actor=who,
            action=action,
            session=session,
            before=before,
            after=_ownership(session),
            request_meta=request_meta,
        )
    return session


def session_hand(
    *,
    session_id: Any,
    to: str | None,
    seen_owner: str | None = "",
    actor: Actor = None,
    request_meta: dict | None = None,
) -> AgentSession:
    """Hand the session to the operator called `to`, or put it back in the queue (no
    owner) when `to` is empty. Refused (409) unless its owner is still `seen_owner`.
    Handed to the one who owns it already: nothing changes (not audited)."""
    who = _actor(actor)
    _person(who, "hand a session on")
    if not can_operate(who.user):
        raise ActionError("only operators can hand sessions on", code="forbidden")
    with transaction.atomic():
        session = _locked(session_id, who.user)
        target = _operator_named(to) if to and to.strip() else None
        if target is not None and not can_operate_session(target, session):
            raise ActionError(
                f"{target.get_username()} does not act on this session's team: a session is "
                "handed to someone who can",
                code="bad_status",
                field="to",
            )
        if session.owner_id == (target.pk if target is not None else None):
            return session
        _check_seen(session, seen_owner)
        before = _ownership(session)
        _set_owner(session, target)
        audit(
            actor=who,
            action=AuditAction.HAND if target is not None else AuditAction.UNASSIGN,
            session=session,
            before=before,
            after=_ownership(session),
            request_meta=request_meta,
        )
    return session


def session_add_note(
    *,
    session_id: Any,
    text: str,
    actor: Actor = None,
    request_meta: dict | None = None,
) -> SessionNote:
    """Leave a plain-text note on the session, at the step it has reached (the trace
    shows it in the margin beside that step). At most MAX_REASON_CHARS characters; shown
    as written, never as HTML or Markdown. Audited with its text."""
    who = _actor(actor)
    _person(who, "leave a note")
    if not can_operate(who.user):
        raise ActionError("only operators can leave notes", code="forbidden")
    text = _bounded(text, "note")
    if not text:
        raise ActionError("the note is empty: write something", code="empty_input", field="note")
    try:
        check_text(text, "note")
    except InvalidInput as exc:
        raise ActionError(str(exc), field="note") from None
    text = redactor().text(text)
    with transaction.atomic():
        session = _locked(session_id, who.user)
        note = SessionNote.objects.create(
            session=session,
            author=who.user,
            author_label=who.label,
            text=text,
            seq=session.last_seq,
        )
        audit(
            actor=who,
            action=AuditAction.NOTE,
            session=session,
            after={"note": note.pk, "seq": note.seq, "text": text},
            request_meta=request_meta,
        )
    return note
