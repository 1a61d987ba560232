"""Every operator action the dashboard offers, declared once.

`ACTIONS` lists the actions on one session (posted to `sessions:action`, whose URL
`dashboard/urls.py` builds from this table), `BULK_ACTIONS` those on a selection from the
list (posted to `sessions:bulk`). Each entry says who may take it (`permission`), which
status-policy rule of AgentSession allows it (`policy`, the `*_refusal` method the
service enforces under its lock), the service it calls, the form fields it reads, and
whether it asks for a confirmation or a reason first. Its `run` is the action's own small
view body: it reads the form, calls the service and says what happened; the one generic
view (`views.session_action`) does the rest (access, errors, the redraw), so no two
actions can differ there. The permission tests read this table: an action added here is
covered by them without another line."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from django.urls import reverse

from agent_runtime.state import OperatorAction

from ..models import AgentSession
from ..permissions import can_operate
from ..selectors import core as selectors
from ..services import core as services
from ..services import workqueue
from ..services.graphs import session_answer_interrupt
from ..validation import InvalidInput, load_json, parse_int
from ..web.http import positive_int


@dataclass(frozen=True)
class Permission:
    """Who may take an action, and what a refused user is told."""

    allows: Callable[[Any], bool]
    refusal: str


OPERATE = Permission(can_operate, "only operators can change sessions")


@dataclass(frozen=True)
class ActionInput:
    """What an action's `run` gets: the session, the posted form, who, and the request's
    metadata for the audit record."""

    session: AgentSession
    form: Mapping[str, Any]
    actor: Any
    meta: dict[str, Any]


@dataclass(frozen=True)
class Done:
    """What an action did, as the operator is told; `goto` is a page to go to instead of
    redrawing this one (a fork opens the new session)."""

    text: str
    goto: str | None = None


Reason = Literal["none", "optional", "required"]


@dataclass(frozen=True)
class Action:
    """One operator action on one session."""

    name: str  # the last segment of its URL, /sessions/<id>/actions/<name>/
    label: str
    run: Callable[[ActionInput], Done]
    service: Callable[..., Any]
    # The AgentSession method that says why the status refuses it (None: any status).
    # The service asks it under the session's lock; the page offers the action by it.
    policy: str | None
    fields: tuple[str, ...] = ()
    permission: Permission = OPERATE
    # Asked before it is taken: "preview" (a preview whose button confirms, built by
    # `preview`), or the question the browser asks (hx-confirm); "" when none.
    confirm: str = ""
    # An action with more than one decision (its `choice_field` names it) asks each its own
    # question: {value: question}; a value absent here is taken without asking.
    choice_field: str = ""
    confirms: Mapping[str, str] | None = None
    reason: Reason = "none"
    preview: Callable[[AgentSession, Mapping[str, Any]], selectors.Preview] | None = None

    def refusal(self, session: AgentSession) -> tuple[str, str] | None:
        """Why the session's status refuses this action now (message, code), or None."""
        return getattr(session, self.policy)() if self.policy else None


@dataclass(frozen=True)
class BulkAction:
    """One action on a selection of sessions from the list; each session is tried on its
    own and the report says what became of each."""

    name: str  # the form's `action` value
    label: str
    run_one: Callable[[AgentSession, int, Any, dict[str, Any]], str]
    service: Callable[..., Any]
    policy: str | None
    permission: Permission = OPERATE
    confirm: str = "bulk"  # the list asks "This will ... N sessions" before it is taken


# --- Reading a form -----------------------------------------------------------------------


def seq_field(raw: str | None, what: str) -> int:
    try:
        return parse_int(raw if raw is not None else "", what)
    except InvalidInput:
        raise services.ActionError(f"choose a {what} (a step number)", code="invalid") from None


def json_field(raw: str, what: str, *, text_allowed: bool = False) -> Any:
    """JSON from a form field (depth-checked first); with `text_allowed`, what does not
    parse as JSON is taken as plain text."""
    try:
        return load_json(raw, what)
    except InvalidInput as exc:
        if text_allowed and exc.problem.startswith("not valid JSON"):
            return raw
        raise services.ActionError(str(exc), code="invalid") from None


def budget_fields(form: Mapping[str, Any]) -> dict[str, Any]:
    """The budgets a form gives: a field left empty is unchanged, `none` lifts the limit."""
    changes: dict[str, Any] = {}
    for name in services.BUDGET_FIELDS:
        raw = (form.get(name) or "").strip()
        if not raw:
            continue
        if raw.lower() == "none":
            changes[name] = None
            continue
        try:
            changes[name] = int(raw) if name in ("max_steps", "max_tokens") else float(raw)
        except ValueError:
            kind = "a whole number" if name in ("max_steps", "max_tokens") else "a number"
            raise services.ActionError(
                f"{name.replace('_', ' ')}: expected {kind} or 'none', got {raw[:40]!r}",
                field=name,
            ) from None
    return changes


# --- The actions, one small function each ---------------------------------------------------


def resume(a: ActionInput) -> Done:
    services.session_resume(session_id=a.session.id, actor=a.actor, request_meta=a.meta)
    return Done("Resumed: queued for a worker from its head checkpoint.")


def cancel(a: ActionInput) -> Done:
    # Read before the cancel, which ends the lease: the worker learns of it at its next
    # write.
    stops_worker = a.session.has_live_worker()
    services.session_cancel(session_id=a.session.id, actor=a.actor, request_meta=a.meta)
    return Done("Cancelled: the worker stops at its next step." if stops_worker else "Cancelled.")


def rollback(a: ActionInput) -> Done:
    seq = seq_field(a.form.get("checkpoint_seq"), "checkpoint")
    services.checkpoint_rollback(
        session_id=a.session.id, checkpoint_seq=seq, actor=a.actor, request_meta=a.meta
    )
    return Done(
        f"Rolled back to checkpoint {seq}; later steps are superseded. Paused until resumed."
    )


def fork(a: ActionInput) -> Done:
    seq = seq_field(a.form.get("checkpoint_seq"), "checkpoint")
    new = services.session_fork(
        session_id=a.session.id, checkpoint_seq=seq, actor=a.actor, request_meta=a.meta
    )
    return Done(
        f"Forked from checkpoint {seq} of {a.session.id}.",
        goto=reverse("sessions:detail", args=[new.id]),
    )


def approve(a: ActionInput) -> Done:
    services.session_approve(
        session_id=a.session.id,
        actor=a.actor,
        reason=a.form.get("reason", ""),
        request_meta=a.meta,
    )
    return Done("Approved: the tool call runs now.")


def reject(a: ActionInput) -> Done:
    services.session_reject(
        session_id=a.session.id,
        actor=a.actor,
        reason=a.form.get("reason", ""),
        request_meta=a.meta,
    )
    return Done("Rejected: the model is told, and the session goes on.")


def answer(a: ActionInput) -> Done:
    value = json_field(a.form.get("value", ""), "the answer", text_allowed=True)
    session_answer_interrupt(
        session_id=a.session.id, value=value, actor=a.actor, request_meta=a.meta
    )
    return Done("Answered: the graph resumes with it.")


UNCERTAIN_DONE = {
    OperatorAction.RERUN: "The tool call runs again, with the same idempotency key.",
    OperatorAction.RECORD_RESULT: "Result recorded by hand; the session goes on.",
    OperatorAction.FAIL: "Session failed: the side effect stays uncertain, on record.",
}


def uncertain(a: ActionInput) -> Done:
    resolution = a.form.get("resolution", "")
    output = None
    if resolution == OperatorAction.RECORD_RESULT:
        output = json_field(a.form.get("output", ""), "the recorded result")
    services.session_resolve_uncertain(
        session_id=a.session.id,
        resolution=resolution,
        output=output,
        note=a.form.get("note", ""),
        actor=a.actor,
        request_meta=a.meta,
    )
    return Done(UNCERTAIN_DONE[OperatorAction(resolution)])  # checked by the service above


def message(a: ActionInput) -> Done:
    services.session_send_message(
        session_id=a.session.id,
        content=a.form.get("content", ""),
        actor=a.actor,
        request_meta=a.meta,
    )
    return Done("Message sent; the session is queued.")


def instruct(a: ActionInput) -> Done:
    services.session_add_instruction(
        session_id=a.session.id, text=a.form.get("text", ""), actor=a.actor, request_meta=a.meta
    )
    return Done("Instruction added as an operator step; the session is queued.")


def correct(a: ActionInput) -> Done:
    seq = seq_field(a.form.get("result_seq"), "tool result")
    output = json_field(a.form.get("output", ""), "the corrected output")
    services.session_correct_result(
        session_id=a.session.id,
        result_seq=seq,
        output=output,
        note=a.form.get("note", ""),
        actor=a.actor,
        request_meta=a.meta,
    )
    return Done(f"Result of step {seq} corrected (an operator step); the session is queued.")


def budgets(a: ActionInput) -> Done:
    changes = budget_fields(a.form)
    queue = a.form.get("resume") == "on"
    services.session_set_budgets(
        session_id=a.session.id, budgets=changes, resume=queue, actor=a.actor, request_meta=a.meta
    )
    return Done("Budgets set" + ("; the session is queued." if queue else "."))


def hold(a: ActionInput) -> Done:
    services.session_set_legal_hold(
        session_id=a.session.id,
        hold=True,
        note=a.form.get("note", ""),
        actor=a.actor,
        request_meta=a.meta,
    )
    return Done("On legal hold: no retention policy deletes anything of it.")


def release(a: ActionInput) -> Done:
    services.session_set_legal_hold(
        session_id=a.session.id,
        hold=False,
        note=a.form.get("note", ""),
        actor=a.actor,
        request_meta=a.meta,
    )
    return Done("Legal hold released: retention policies apply to it again.")


def take(a: ActionInput) -> Done:
    before = workqueue.owner_name(a.session)
    session = workqueue.session_take(
        session_id=a.session.id,
        seen_owner=a.form.get("seen_owner", ""),
        actor=a.actor,
        request_meta=a.meta,
    )
    if before and before != workqueue.owner_name(session):
        return Done(f"Taken over from {before}: it is yours now, and everyone sees it.")
    return Done("Taken: it is yours, and everyone who opens it sees it.")


def hand(a: ActionInput) -> Done:
    to = (a.form.get("to") or "").strip()
    workqueue.session_hand(
        session_id=a.session.id,
        to=to,
        seen_owner=a.form.get("seen_owner", ""),
        actor=a.actor,
        request_meta=a.meta,
    )
    return Done(f"Handed to {to}." if to else "Put back in the queue: nobody owns it.")


def note(a: ActionInput) -> Done:
    workqueue.session_add_note(
        session_id=a.session.id, text=a.form.get("note", ""), actor=a.actor, request_meta=a.meta
    )
    return Done("Note left: it shows in the trace's margin, beside the latest step.")


def _rollback_preview(session: AgentSession, params: Mapping[str, Any]) -> selectors.Preview:
    seq = positive_int(params.get("seq"))
    if seq is None:
        raise services.ActionError("choose a checkpoint (a step number) to roll back to")
    return selectors.preview_rollback(session, seq)


def _actions(*actions: Action) -> dict[str, Action]:
    return {action.name: action for action in actions}


ACTIONS: dict[str, Action] = _actions(
    Action(
        "resume",
        "Resume",
        resume,
        services.session_resume,
        "resume_refusal",
        confirm="preview",
        preview=lambda session, _params: selectors.preview_resume(session),
    ),
    Action(
        "cancel",
        "Cancel",
        cancel,
        services.session_cancel,
        "cancel_refusal",
        confirm=(
            "Cancel this session? A run in progress stops; only a rollback to one of its "
            "checkpoints runs it again."
        ),
    ),
    Action(
        "rollback",
        "Roll back to a checkpoint",
        rollback,
        services.checkpoint_rollback,
        "rollback_refusal",
        fields=("checkpoint_seq",),
        confirm="preview",
        preview=_rollback_preview,
    ),
    # A fork copies the history up to a checkpoint whatever the status (can_fork).
    Action(
        "fork",
        "Fork",
        fork,
        services.session_fork,
        None,
        fields=("checkpoint_seq",),
        confirm="Fork a new session from this checkpoint? It starts paused.",
    ),
    Action(
        "approve",
        "Approve the pending tool call",
        approve,
        services.session_approve,
        "decision_refusal",
        fields=("reason",),
        # The tool runs with the arguments shown: nothing in Respawn undoes its effect.
        confirm="Approve? The tool runs now with the arguments shown; this cannot be undone.",
        reason="optional",
    ),
    Action(
        "reject",
        "Reject the pending tool call",
        reject,
        services.session_reject,
        "decision_refusal",
        fields=("reason",),
        reason="required",  # the model is told why
    ),
    Action(
        "answer",
        "Answer the graph's question",
        answer,
        session_answer_interrupt,
        "decision_refusal",
        fields=("value",),
    ),
    Action(
        "uncertain",
        "Resolve an uncertain tool call",
        uncertain,
        services.session_resolve_uncertain,
        "decision_refusal",
        fields=("resolution", "output", "note"),
        # Running it again may do the side effect twice, and failing ends the session:
        # both are asked about. Recording a result by hand goes on.
        choice_field="resolution",
        confirms={
            OperatorAction.RERUN: (
                "Run the tool again? It runs now with the arguments shown: if the first "
                "run did happen, its side effect may happen twice. This cannot be undone."
            ),
            OperatorAction.FAIL: "Fail this session?",
        },
        reason="optional",
    ),
    Action(
        "message",
        "Send a message",
        message,
        services.session_send_message,
        "message_refusal",
        fields=("content",),
    ),
    Action(
        "instruct",
        "Add an instruction and resume",
        instruct,
        services.session_add_instruction,
        "edit_refusal",
        fields=("text",),
    ),
    Action(
        "correct",
        "Correct a tool result and resume",
        correct,
        services.session_correct_result,
        "edit_refusal",
        fields=("result_seq", "output", "note"),
        reason="optional",
    ),
    Action(
        "budgets",
        "Set budgets",
        budgets,
        services.session_set_budgets,
        "budgets_refusal",
        fields=(*services.BUDGET_FIELDS, "resume"),
    ),
    # A legal hold is about retention, not the run: any status may be held or released.
    Action(
        "hold",
        "Put on legal hold",
        hold,
        services.session_set_legal_hold,
        None,
        fields=("note",),
        reason="required",
    ),
    Action("release", "Release the legal hold", release, services.session_set_legal_hold, None),
    # The work queue: any status. Each names the owner the person saw (`seen_owner`), and
    # is refused if it changed since (a stale form never takes a session from someone).
    Action("take", "Take (assign to me)", take, workqueue.session_take, None, ("seen_owner",)),
    Action("hand", "Hand to someone", hand, workqueue.session_hand, None, ("to", "seen_owner")),
    Action("note", "Leave a note", note, workqueue.session_add_note, None, ("note",)),
)

# The actions whose confirmation is a preview (GET sessions:preview), by name.
PREVIEWS: dict[str, Action] = {name: a for name, a in ACTIONS.items() if a.preview}


def bulk_resume(session: AgentSession, position: int, actor: Any, meta: dict[str, Any]) -> str:
    return services.session_resume_in_bulk(
        session_id=session.id, position=position, actor=actor, request_meta=meta
    )


def bulk_cancel(session: AgentSession, position: int, actor: Any, meta: dict[str, Any]) -> str:
    services.session_cancel(session_id=session.id, actor=actor, request_meta=meta)
    return "cancelled"


BULK_ACTIONS: dict[str, BulkAction] = {
    bulk.name: bulk
    for bulk in (
        BulkAction(
            "resume",
            "Resume selected",
            bulk_resume,
            services.session_resume_in_bulk,
            "resume_refusal",
        ),
        BulkAction(
            "cancel",
            "Cancel selected",
            bulk_cancel,
            services.session_cancel,
            "cancel_refusal",
        ),
    )
}
