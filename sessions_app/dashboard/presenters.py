"""Turn stored rows into what the dashboard shows. The one place that knows payload shapes
on the view side, so templates never poke at JSON: numbers and durations as a person reads
them, one line per step, the runs and turns a trace is grouped by, and the active-time axis
of the timeline."""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agent_runtime import loop
from agent_runtime.state import (
    ErrorPayload,
    OperatorAction,
    PayloadField,
    SystemEvent,
    as_error,
    as_model,
    as_operator,
    as_system,
    as_tool_call,
    as_tool_result,
    step_event,
    step_text,
    tool_ok,
    usage_cost,
)
from agent_runtime.tools import INFRASTRUCTURE_PREFIX
from agent_runtime.upgraders import IncompatibleSchemaError, load_step_payload

from ..formats import format_duration, format_ms
from ..models import AgentSession, Status, Step
from ..sdk_glue import PROGRAM_AGENTS

LONG_TEXT = 600  # characters before a block is collapsed behind "show all"
SUMMARY_CHARS = 160  # characters of a step's one-line summary


# --- Numbers a person reads -------------------------------------------------------------


def format_count(value: Any) -> str:
    """20000 -> "20,000"; anything else as it is."""
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return str(value)


def format_cost(value: Any) -> str:
    """A cost as the provider reported it: "0.0123", "12.40"; "" when nothing was reported."""
    try:
        cost = float(value or 0)
    except (TypeError, ValueError):
        return ""
    if not cost:
        return ""
    if cost >= 1:
        return f"{cost:,.2f}"
    return f"{cost:.4f}".rstrip("0").rstrip(".") if cost >= 0.0001 else f"{cost:.2e}"


def format_ago(when: datetime | None, now: datetime) -> str:
    """ "just now", "12 s ago", "5 min ago", "3 h ago", "4 d ago"; "in 8 s" for the future."""
    if when is None:
        return ""
    seconds = (now - when).total_seconds()
    future = seconds < 0
    seconds = abs(seconds)
    if seconds < 2:
        return "just now"
    if seconds < 60:
        text = f"{seconds:.0f} s"
    elif seconds < 3600:
        text = f"{seconds // 60:.0f} min"
    elif seconds < 86400:
        text = f"{seconds // 3600:.0f} h"
    elif seconds < 86400 * 60:
        text = f"{seconds // 86400:.0f} d"
    else:
        return when.strftime("%Y-%m-%d")
    return f"in {text}" if future else f"{text} ago"


@dataclass(frozen=True)
class StatusView:
    label: str  # plain language: "Waiting for a person"
    hint: str  # what it means, for a tooltip


STATUS_TEXT: dict[str, tuple[str, str]] = {
    Status.QUEUED: ("Queued", "waiting for a worker to take it"),
    Status.RUNNING: ("Running", "a worker is running it"),
    Status.WAITING_INPUT: ("Waiting for a person", "a person must approve or decide something"),
    Status.PAUSED: ("Paused", "nothing runs until someone resumes it"),
    Status.COMPLETED: ("Completed", "finished with an answer"),
    Status.FAILED: ("Failed", "stopped on an error; it can be resumed"),
    Status.CANCELLED: (
        "Cancelled",
        "stopped by a person; only a rollback to one of its checkpoints runs it again",
    ),
}


def status_view(session: AgentSession) -> StatusView:
    if session.is_stuck():
        return StatusView(
            "Stuck", "should be running, but no worker holds its lease (the reconciler retries)"
        )
    if session.paused_by_budget:
        return StatusView(
            "Paused by its budget", "a budget is used up: raise it to continue (below)"
        )
    if session.status == Status.COMPLETED and session.failed_calls:
        n = session.failed_calls
        return StatusView(
            f"Completed with {n} failed tool call{'' if n == 1 else 's'}",
            "finished with an answer, but tool calls failed (on the tool, or on the "
            "infrastructure after every retry): their effects may be missing",
        )
    if session.status == Status.WAITING_INPUT and session.run_by_program():
        return StatusView(
            "Waiting for its program",
            f"{PROGRAM_AGENTS[session.agent]} writes it: its next call continues it",
        )
    label, hint = STATUS_TEXT.get(session.status, (session.status, ""))
    return StatusView(label, hint)


# What a plan item still open says once its session ended: a finished session's plan is as
# it was left, never "in progress". A completed session's agent may simply not have ticked
# its last items off (it answered): they are "not marked done", not "not started".
LEFT_OPEN: dict[str, dict[str, str]] = {
    Status.COMPLETED: {"in_progress": "not marked done", "pending": "not marked done"},
    Status.FAILED: {"in_progress": "unfinished", "pending": "not started"},
    Status.CANCELLED: {"in_progress": "unfinished", "pending": "not started"},
}


def final_plan(plan: list[dict[str, Any]], status: str) -> list[dict[str, Any]]:
    """The plan of a session that ended (completed, failed, cancelled): an item left open
    says so, and is styled as such (its `status` becomes "left_open")."""
    labels = LEFT_OPEN.get(status, {})
    final = []
    for item in plan:
        label = labels.get(str(item.get("status")))
        final.append({**item, "label": label, "status": "left_open"} if label else item)
    return final


@dataclass(frozen=True)
class ProgressView:
    done: int
    total: int | None
    note: str

    @property
    def percent(self) -> int | None:
        if self.total is None:
            return None
        return min(100, self.done * 100 // self.total) if self.total else 100


def progress_view(session: AgentSession, state: dict[str, Any]) -> ProgressView | None:
    """Progress as the header shows it. A tool's report (done/total and a note, "sending to
    ops") is news of a run in progress: shown while the session is queued or running. Once
    it stops, what stays is the durable progress of batch work (the head state's cursor),
    or nothing."""
    if session.is_runnable:
        if session.progress_total is None and not session.progress_note:
            return None
        return ProgressView(
            session.progress_done or 0, session.progress_total, session.progress_note
        )
    cursor = state.get("batch_cursor")
    if not isinstance(cursor, dict):
        return None
    done, total = cursor.get("done"), cursor.get("total")
    if not isinstance(done, int) or not isinstance(total, int):
        return None
    return ProgressView(done, total, "")


# --- Steps ------------------------------------------------------------------------------


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def one_line(value: Any, limit: int = SUMMARY_CHARS) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class Block:
    label: str
    text: str
    is_json: bool = False

    @property
    def is_message(self) -> bool:
        """What was said (by the user, the model or an operator), not data."""
        return self.label in ("message", "text", "instruction")

    @property
    def is_long(self) -> bool:
        return len(self.text) > LONG_TEXT or self.text.count("\n") > 12

    @property
    def preview(self) -> str:
        first = self.text[:LONG_TEXT]
        lines = first.split("\n")[:12]
        return "\n".join(lines)


@dataclass(frozen=True)
class Mark:
    """A badge on a step line: css class, text, and what it means."""

    css: str
    label: str
    title: str = ""


@dataclass(frozen=True)
class Attempt:
    number: int
    ok: bool
    error: str


KIND_LABEL = {
    "user": "user",
    "model": "model",
    "tool_call": "call",
    "tool_result": "result",
    "error": "error",
    "operator": "operator",
    "system": "system",
}

# Operator steps that are a decision on a pending tool call: part of that call's turn.
DECISIONS = {*loop.DECISIONS, OperatorAction.FAIL}
# System events that belong to the turn of the model step before them.
TURN_EVENTS = {
    SystemEvent.FAN_OUT,
    SystemEvent.JOINED,
    SystemEvent.WAITING_FOR_APPROVAL,
    SystemEvent.UNCERTAIN_CALL,
}
# Steps after which a run has nothing more to do: a run whose last step is anything else
# stopped in the middle (its worker died or lost its lease).
RUN_END_EVENTS = {*TURN_EVENTS, SystemEvent.CANCELLED}
# ...and a runner's (an agent with a turn loop of its own, e.g. a LangGraph graph).
RUN_END_EVENTS |= {
    SystemEvent.ALREADY_ANSWERED,
    SystemEvent.RUN_FINISHED,
    SystemEvent.BUDGET_REACHED,
}


@dataclass
class StepView:
    step: Step
    headline: str = ""
    kind_label: str = ""
    name: str = ""
    status: str = ""  # css: "ok", "error", "retried", "waiting", ""
    status_label: str = ""
    summary: str = ""
    blocks: list[Block] = field(default_factory=list)
    tone: str = ""  # "", "error", "ok", "warn"
    duration_ms: float | None = None
    checkpoint_reasons: list[str] = field(default_factory=list)
    load_error: str = ""
    branch: str = ""  # "3/8": the tool call or result of a fan-out branch, and how many ran
    marks: list[Mark] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    noise: bool = False  # system and plan steps: a muted line
    in_turn: bool = False  # indented under its turn's model step
    tokens: int = 0
    cost: str = ""
    payload: dict[str, Any] = field(default_factory=dict)

    @property
    def seq(self) -> int:
        return self.step.seq

    @property
    def kind(self) -> str:
        return self.step.kind

    @property
    def duration(self) -> str:
        return format_ms(self.duration_ms)

    @property
    def event(self) -> str:
        return step_event(self.kind, self.payload) or ""


def branch_label(kind: str, payload: Any) -> str:
    """The fan-out branch label ("3/8") of a tool call or result; "" for anything else."""
    if kind not in ("tool_call", "tool_result") or not isinstance(payload, dict):
        return ""
    branch = as_tool_call(payload).get("branch")
    return f"{branch.get('index')}/{branch.get('of')}" if isinstance(branch, dict) else ""


def _text(payload: dict[str, Any]) -> str:
    return step_text(payload) or ""


def _args_line(arguments: Any) -> str:
    if isinstance(arguments, dict):
        return ", ".join(f"{k}={one_line(v, 60)}" for k, v in arguments.items())
    return one_line(arguments, 80)


def _plan_line(plan: list[Any]) -> str:
    """A plan as one line: "✓ compute · ▸ save the result · ○ answer"."""
    glyph = {"done": "✓", "in_progress": "▸", "pending": "○", "skipped": "–", "failed": "✗"}
    parts = []
    for item in plan:
        if isinstance(item, dict):
            parts.append(f"{glyph.get(str(item.get('status')), '·')} {item.get('title', '')}")
    return " · ".join(parts)


def load_payload(step: Step) -> tuple[dict[str, Any], str]:
    """The step's payload loaded (upgraded) as a worker would, and "" — or the stored
    payload and the reason it cannot be loaded."""
    try:
        return load_step_payload(step.kind, step.payload, step.schema_version).value, ""
    except IncompatibleSchemaError as exc:
        raw = step.payload if isinstance(step.payload, dict) else {"value": step.payload}
        return raw, str(exc)


def attempts_of(payload: dict[str, Any]) -> list[Attempt]:
    """Each attempt of a tool call and how it ended; errors of attempts before the recorded
    ones (older results kept only the count) say so."""
    result = as_tool_result(payload)
    attempts = int(result.get("attempts") or 1)
    if attempts <= 1:
        return []
    errors = [str(e) for e in result.get("attempt_errors") or []]
    out = []
    for number in range(1, attempts):
        index = number - 1 - (attempts - 1 - len(errors))
        error = errors[index] if 0 <= index < len(errors) else "(this attempt's error was not kept)"
        out.append(Attempt(number, False, error))
    ok = tool_ok(payload)
    out.append(Attempt(attempts, ok, "" if ok else str(result.get("error") or "")))
    return out


def present_step(step: Step, checkpoint_reasons: list[str] | None = None) -> StepView:
    """The step as one line a person scans, and the details behind it. A payload this code
    cannot load is shown raw, with the reason."""
    payload, load_error = load_payload(step)
    kind = step.kind
    view = StepView(
        step=step,
        kind_label=KIND_LABEL.get(kind, kind),
        checkpoint_reasons=checkpoint_reasons or [],
        load_error=load_error,
        payload=payload,
    )
    if step.started_at and step.finished_at and kind not in ("user", "operator", "tool_call"):
        # What a person or a client wrote takes no time; anything a worker did does.
        view.duration_ms = max((step.finished_at - step.started_at).total_seconds() * 1000, 0.0)
    if step.superseded:
        view.marks.append(
            Mark("superseded", "superseded", "rolled back: kept in the history, not in the state")
        )
    if load_error:
        view.tone = view.status = "error"
        view.status_label = "cannot be loaded"
        view.headline = f"{kind} (cannot be loaded)"
        view.summary = one_line(load_error)
        view.blocks.append(Block("stored payload", pretty(step.payload), True))
        return view
    view.branch = branch_label(kind, payload)
    if view.branch:
        view.marks.append(
            Mark("branch", f"branch {view.branch}", "a fan-out branch: these calls ran in parallel")
        )
    _PRESENTERS.get(kind, _present_system)(view, step, payload)
    return view


def _present_user(view: StepView, step: Step, payload: dict[str, Any]) -> None:
    view.headline = "User"
    view.summary = one_line(_text(payload))
    view.blocks.append(Block("message", _text(payload)))


def _present_model(view: StepView, step: Step, payload: dict[str, Any]) -> None:
    model = as_model(payload)
    calls = model.get("tool_calls") or []
    view.name = str(model.get("model") or "")
    view.headline = f"Model · {view.name}".rstrip(" ·")
    view.tokens = (step.tokens_in or 0) + (step.tokens_out or 0)
    view.cost = format_cost(usage_cost(payload))
    text = _text(payload)
    names = ", ".join(str(c.get("name")) for c in calls)
    view.summary = one_line(f"{text} → calls {names}" if calls and text else text or names)
    if text:
        view.blocks.append(Block("text", text))
    for call in calls:
        view.blocks.append(
            Block(
                f"calls {call.get('name')} ({call.get('id')})", pretty(call.get("arguments")), True
            )
        )
    if not calls:
        view.tone = view.status = "ok"
        view.status_label = "answer"


def _present_tool_call(view: StepView, step: Step, payload: dict[str, Any]) -> None:
    call = as_tool_call(payload)
    view.name = str(call.get("name") or "")
    view.headline = f"Tool call · {view.name}"
    view.in_turn = True
    view.summary = one_line(f"{view.name}({_args_line(call.get('arguments'))})")
    view.blocks.append(Block("arguments", pretty(call.get("arguments")), True))
    if step.idempotency_key:
        view.blocks.append(Block("idempotency key", step.idempotency_key))


def _present_tool_result(view: StepView, step: Step, payload: dict[str, Any]) -> None:
    result = as_tool_result(payload)
    ok = tool_ok(payload)
    attempts = int(result.get("attempts") or 1)
    view.name = str(result.get("name") or "")
    view.headline = f"Tool result · {view.name} · {'ok' if ok else 'error'}"
    view.in_turn = True
    view.attempts = attempts_of(payload)
    if ok:
        view.status, view.status_label = "ok", "ok"
        view.summary = one_line(result.get("output"))
    else:
        view.tone = view.status = "error"
        view.status_label = "failed"
        view.summary = one_line(result.get("error") or "failed")
    if attempts > 1:
        view.headline += f" · {attempts} attempts"
        retried = f"after {attempts} attempts"
        view.status_label = f"ok {retried}" if ok else f"failed {retried}"
        if ok:
            view.status = "retried"
        first = view.attempts[0].error if view.attempts else ""
        view.marks.append(Mark("retried", f"{attempts - 1} retried", f"attempt 1: {first}"))
    if attempts == 0:
        view.status_label = "not run" if not ok else "recorded"
    infrastructure = sum(
        1 for e in result.get("attempt_errors") or [] if str(e).startswith(INFRASTRUCTURE_PREFIX)
    )
    if not ok and result.get("failure") == "infrastructure":
        view.marks.append(
            Mark(
                "infrastructure",
                "infrastructure failure",
                "the database, Redis or the network failed under the tool on every try: "
                "not the tool's own error; its effect may be missing",
            )
        )
    elif infrastructure:
        view.marks.append(
            Mark(
                "infrastructure",
                f"{infrastructure} infrastructure error{'' if infrastructure == 1 else 's'}",
                "retried: the database, Redis or the network failed under the tool",
            )
        )
    if result.get("plan_update") is not None:
        view.noise = True
        view.summary = "plan: " + _plan_line(result["plan_update"])
    if result.get("recorded_by_operator"):
        view.marks.append(
            Mark(
                "operator",
                f"recorded by {result['recorded_by_operator']}",
                "a person recorded this result; the tool did not report it",
            )
        )
    if result.get("error"):
        view.blocks.append(Block("error", str(result["error"])))
    if result.get("output") is not None:
        view.blocks.append(Block("output", pretty(result.get("output")), True))
    if result.get("plan_update") is not None:
        view.blocks.append(Block("plan", _plan_line(result["plan_update"])))


def _present_error(view: StepView, step: Step, payload: dict[str, Any]) -> None:
    error = as_error(payload)
    view.name = str(error.get("where") or "")
    view.headline = f"Error · {view.name}".rstrip(" ·")
    view.tone = view.status = "error"
    view.status_label = "failed"
    view.summary = one_line(error.get("error", ""))
    if error.get("where") == "worker":
        view.marks.append(Mark("crash", "worker died", "the worker process died running this"))
    view.blocks.append(Block("error", str(error.get("error", ""))))
    details = {k: v for k, v in payload.items() if k not in ErrorPayload.__annotations__}
    if details:
        view.blocks.append(Block("details", pretty(details), True))


def _operator_summary(action: str, payload: dict[str, Any]) -> str:
    op = as_operator(payload)
    if action == OperatorAction.INSTRUCTION:
        return f"instruction: {_text(payload)}"
    if action == OperatorAction.CORRECT_RESULT:
        return f"corrected the result of #{op.get('result_seq')}: " + one_line(
            op.get("output"), 100
        )
    if action == OperatorAction.ROLLBACK:
        return (
            f"rolled back to checkpoint #{op.get('checkpoint_seq')} "
            f"({format_count(op.get('superseded_steps', 0))} steps superseded)"
        )
    if action in (OperatorAction.APPROVE, OperatorAction.REJECT):
        verb = "approved" if action == OperatorAction.APPROVE else "rejected"
        reason = f": {op['reason']}" if op.get("reason") else ""
        return f"{verb} {op.get('tool') or op.get('call_id', '')}{reason}"
    if action == OperatorAction.CANCEL:
        return "cancelled the session" + (" while it ran" if op.get("while_running") else "")
    if action == OperatorAction.RERUN:
        return "said the uncertain call did not happen: run it again"
    if action == OperatorAction.RECORD_RESULT:
        return "recorded the uncertain call's result: " + one_line(op.get("output"), 100)
    if action == OperatorAction.FAIL:
        return "failed the session over an uncertain side effect"
    if action == OperatorAction.SET_BUDGETS:
        changes = dict(op.get("budgets") or {})
        if "deadline" in payload:
            changes["deadline"] = op["deadline"] or "none"
        listed = ", ".join(f"{k}={'none' if v is None else v}" for k, v in changes.items())
        reason = f" ({op['reason']})" if op.get("reason") else ""
        return f"set budgets: {listed}{reason}"
    return action


def _present_operator(view: StepView, step: Step, payload: dict[str, Any]) -> None:
    op = as_operator(payload)
    action = str(op.get("action") or "edit")
    actor = str(op.get("actor") or "someone")
    view.name = action
    view.headline = f"Operator · {action} · by {actor}"
    view.tone = "warn"
    view.in_turn = action in DECISIONS
    view.summary = one_line(_operator_summary(action, payload))
    view.marks.append(Mark("operator", f"by {actor}", "an operator's step, written by a person"))
    if action == OperatorAction.INSTRUCTION:
        view.blocks.append(Block("instruction", _text(payload)))
    shown = (PayloadField.ACTION, PayloadField.ACTOR, PayloadField.CONTENT)
    details = {k: v for k, v in payload.items() if k not in shown}
    if details:
        view.blocks.append(Block("details", pretty(details), True))


def _waits(view: StepView, label: str, summary: str, *, warn: bool = False) -> None:
    """A system step the session waits at until a person acts: shown, never folded away."""
    view.noise = False
    view.status, view.status_label = "waiting", label
    if warn:
        view.tone = "warn"
    view.summary = one_line(summary)


def _present_system(view: StepView, step: Step, payload: dict[str, Any]) -> None:
    system = as_system(payload)
    event = str(system.get("event") or "")
    view.name = event
    view.headline = f"System · {event}".rstrip(" ·")
    view.noise = True
    view.in_turn = event in TURN_EVENTS
    details = {k: v for k, v in payload.items() if k != PayloadField.EVENT}
    if event == SystemEvent.WAITING_FOR_APPROVAL:
        arguments = _args_line(system.get("arguments"))
        _waits(view, "waiting", f"{system.get('tool')} needs a person's approval ({arguments})")
    elif event == SystemEvent.UNCERTAIN_CALL:
        _waits(
            view,
            "uncertain",
            f"{system.get('tool')} may or may not have run (its worker died during the call); "
            "a person decides",
            warn=True,
        )
    elif event == SystemEvent.FAN_OUT:
        calls = system.get("calls") or []
        view.summary = (
            f"{len(calls)} calls handed to parallel branches "
            f"(at most {system.get('limit')} at once)"
        )
    elif event == SystemEvent.JOINED:
        view.summary = f"all {system.get('results')} branch results in; the next run is queued"
    elif event == SystemEvent.CANCELLED:
        view.status, view.status_label = "error", "cancelled"
        view.summary = f"stopped by a cancel request on {system.get('worker', 'its worker')}"
    elif event == SystemEvent.RUN_STARTED:
        view.summary = f"run started on {system.get('worker', 'a worker')}"
    elif event == SystemEvent.BUDGET_REACHED:
        _waits(
            view,
            "paused",
            f"paused: {system.get('message') or system.get('budget')}; "
            "raise the budget to continue",
            warn=True,
        )
    elif event == SystemEvent.RUN_FINISHED:
        outcome = str(system.get("outcome") or "finished")
        view.status = "ok" if outcome == "completed" else "waiting" if outcome else ""
        view.status_label = outcome
        view.noise = False
        view.summary = one_line(system.get("final_answer") or f"the run ended: {outcome}")
    else:
        view.summary = one_line(details) if payload else ""
    if details:
        view.blocks.append(Block("details", pretty(details), True))


_PRESENTERS = {
    "user": _present_user,
    "model": _present_model,
    "tool_call": _present_tool_call,
    "tool_result": _present_tool_result,
    "error": _present_error,
    "operator": _present_operator,
    "system": _present_system,
}


# --- Runs and turns ---------------------------------------------------------------------


def ends_a_run(step: Step | StepView, payload: dict[str, Any] | None = None) -> bool:
    """Whether a run can have stopped cleanly after this step. A run whose last step is
    anything else stopped in the middle: its worker died, or lost its lease."""
    payload = payload if payload is not None else (step.payload or {})
    kind = step.kind
    if kind in ("error", "operator", "user"):
        return True
    if kind == "model":
        return not as_model(payload).get("tool_calls")
    if kind == "system":
        return step_event(kind, payload) in RUN_END_EVENTS
    if kind == "tool_result":
        # A branch's result: the run handed the turn to branches and ended with fan_out.
        return bool(as_tool_result(payload).get("branch"))
    return False


@dataclass
class RunStart:
    """Why a run started, as the trace tells it."""

    reason: str  # "new", "crash", "operator", "message", "resume", "branches", "continue"
    text: str
    crashed_after: int | None = None  # the seq the previous run's worker stopped after


def run_reason(
    number: int,
    previous: Step | None,
    previous_worker: str | None,
    resumed_by: str | None,
) -> RunStart:
    """Derive why run `number` started from the step just before its run_started step, the
    worker of the run before it, and who resumed the session in between (if someone did)."""
    by = f" by {resumed_by}" if resumed_by else ""
    if (previous is None and number == 1) or (
        number == 1 and previous is not None and previous.kind == "user"
    ):
        return RunStart("new", "a new session")
    if previous is None:
        # The step before it is no longer stored (a retention policy compacted it).
        return RunStart("resume", f"resumed{by}" if by else "continued")
    payload = previous.payload if isinstance(previous.payload, dict) else {}
    event = step_event(previous.kind, payload)
    who = previous_worker or "its worker"
    if not ends_a_run(previous, payload):
        if event == SystemEvent.RUN_STARTED:
            where = f"just after it started (#{previous.seq})"
        else:
            where = f"after #{previous.seq} ({KIND_LABEL.get(previous.kind, previous.kind)})"
        text = f"resumed{by} after a crash: the run on {who} stopped {where} without finishing"
        return RunStart("crash", text, previous.seq)
    if previous.kind == "operator":
        decision = as_operator(payload)
        action = decision.get("action") or "edit"
        return RunStart("operator", f"after {decision.get('actor') or 'an operator'}'s {action}")
    if previous.kind == "user":
        return RunStart("message", "after a new message")
    if previous.kind == "tool_result" or event == SystemEvent.FAN_OUT:
        return RunStart(
            "branches",
            f"resumed{by}: not every fan-out branch finished (a branch's worker died or its "
            "job was lost)",
        )
    if event == SystemEvent.JOINED:
        return RunStart("continue", "after the fan-out joined")
    if previous.kind == "error":
        return RunStart("resume", f"resumed{by} after the failure at #{previous.seq}")
    if resumed_by:
        return RunStart("resume", f"resumed{by}")
    return RunStart("continue", "continued")


class _AtStep:
    """An item of the trace that stands at a step (its view)."""

    view: StepView

    @property
    def seq(self) -> int:
        return self.view.seq


@dataclass
class RunHeader(_AtStep):
    """The boundary line of a run: its number, worker and why it started."""

    view: StepView
    number: int
    worker: str
    start: RunStart
    item_type: str = "run"


@dataclass
class TurnHeader:
    number: int
    continued: bool = False
    item_type: str = "turn"


@dataclass
class StepItem(_AtStep):
    view: StepView
    item_type: str = "step"


@dataclass
class TraceContext:
    """What a page of the trace needs from before its first step."""

    turns_before: int = 0  # model steps before the page (shown in the same view)
    runs_before: int = 0
    worker: str = ""  # the worker of the run the page starts in
    previous: Step | None = None  # the step just before the page's first (by seq)


def build_trace_items(
    views: list[StepView],
    context: TraceContext,
    *,
    previous_steps: dict[int, Step],
    resumes: list[tuple[datetime, str]],
    next_step: Step | None = None,
    stuck_worker: str | None = None,
    grouped: bool = True,
) -> tuple[list[Any], TraceContext]:
    """Steps with their run and turn boundaries, for one page of the trace.

    `previous_steps`: seq -> step, for the step before each run_started on the page (by seq,
    superseded or not); `resumes`: (time, actor) of the session's resume audit events;
    `next_step`: the step after the page, if any (a crash mark on the page's last step);
    `stuck_worker`: set when the session is stuck, for the mark on its last step.
    Returns the items and the context for the page after this one."""
    items: list[Any] = []
    turn, runs, worker = context.turns_before, context.runs_before, context.worker
    if not grouped:
        return [StepItem(v) for v in views], TraceContext(turn, runs, worker)
    in_turn = False
    for index, view in enumerate(views):
        step = view.step
        if step.kind == "system" and view.event == SystemEvent.RUN_STARTED:
            runs += 1
            previous = previous_steps.get(step.seq - 1)
            if previous is None and index == 0 and context.previous is not None:
                previous = context.previous
            resumed_by = _resumed_by(resumes, previous, step)
            start = run_reason(runs, previous, worker or None, resumed_by)
            worker = str(as_system(view.payload).get("worker") or "")
            items.append(RunHeader(view, runs, worker, start))
            in_turn = False
            continue
        if step.kind == "model":
            turn += 1
            items.append(TurnHeader(turn))
            in_turn = True
        elif view.in_turn:
            if not in_turn and turn:
                # A page, or a run, that starts in the middle of a turn.
                items.append(TurnHeader(turn, continued=True))
                in_turn = True
            view.in_turn = in_turn
        else:
            in_turn = False
        items.append(StepItem(view))
    # A worker that died after the page's last step: the next step is a run_started, and
    # this step is not one a run ends on.
    if views:
        last = views[-1]
        crashed = (
            next_step is not None
            and next_step.event == SystemEvent.RUN_STARTED
            and next_step.seq == last.seq + 1
        )
        if (crashed or stuck_worker) and not ends_a_run(last.step, last.payload):
            who = stuck_worker or worker or "its worker"
            last.marks.append(
                Mark("crash", "worker stopped here", f"the run on {who} stopped after this step")
            )
    for index, item in enumerate(items[:-1]):
        # Crashes inside the page: the step before a crash-resumed run's header.
        following = items[index + 1]
        if isinstance(following, RunHeader) and following.start.reason == "crash":
            if isinstance(item, StepItem) and item.seq == following.start.crashed_after:
                item.view.marks.append(Mark("crash", "worker stopped here", following.start.text))
    return items, TraceContext(turn, runs, worker)


def _resumed_by(
    resumes: list[tuple[datetime, str]], previous: Step | None, step: Step
) -> str | None:
    """Who resumed the session between the step before a run and the run's start."""
    start = step.started_at or step.created_at
    since = (previous.finished_at or previous.created_at) if previous is not None else None
    found = None
    for when, actor in resumes:
        if when <= start and (since is None or when >= since):
            found = actor
    return found


# --- The timeline's axis of active time -------------------------------------------------

GAP_COLLAPSE_SECONDS = 2.0  # idle stretches longer than this are collapsed and labelled


@dataclass(frozen=True)
class Gap:
    start: float  # seconds since 1970
    end: float
    reason: str

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def label(self) -> str:
        return f"{format_duration(self.seconds)} {self.reason}"


class ActiveAxis:
    """Maps times (seconds since 1970) to positions on an axis of active time: the
    stretches where some step ran keep their length, idle gaps longer than
    GAP_COLLAPSE_SECONDS become a fixed-width break (labelled with what the session waited
    for)."""

    def __init__(self, intervals: list[tuple[float, float]], gap_reasons=None) -> None:
        self.segments: list[tuple[float, float, float]] = []  # start, end, offset (s)
        self.gaps: list[Gap] = []
        busy: list[list[float]] = []
        for start, end in sorted(intervals):
            end = max(end, start)
            if busy and start <= busy[-1][1] + GAP_COLLAPSE_SECONDS:
                if end > busy[-1][1]:
                    busy[-1][1] = end
            else:
                busy.append([start, end])
        self._build([(start, end) for start, end in busy], gap_reasons)

    @classmethod
    def from_gaps(
        cls, start: float, end: float, gaps: list[tuple[float, float, str]]
    ) -> ActiveAxis:
        """The axis of a span whose long idle gaps (from, to, reason) are already known (the
        database found them): the busy stretches are what lies between them."""
        axis = cls([])
        edges = [start] + [edge for gap in gaps for edge in gap[:2]] + [max(end, start)]
        busy = list(zip(edges[::2], edges[1::2], strict=True))
        reasons = iter([gap[2] for gap in gaps])
        axis._build(busy, lambda _start, _end: next(reasons))
        return axis

    def _build(self, busy: list[tuple[float, float]], gap_reasons) -> None:
        self.segments, self.gaps = [], []
        offset = 0.0
        for index, (start, end) in enumerate(busy):
            if index:
                previous_end = busy[index - 1][1]
                reason = gap_reasons(previous_end, start) if gap_reasons else "idle"
                self.gaps.append(Gap(previous_end, start, reason))
            self.segments.append((start, end, offset))
            offset += end - start
        self.active_seconds = offset
        self._starts = [s[0] for s in self.segments]

    def position(self, when: float) -> tuple[float, int]:
        """(active seconds before `when`, breaks before it)."""
        if not self.segments:
            return 0.0, 0
        index = max(bisect.bisect_right(self._starts, when) - 1, 0)
        start, end, offset = self.segments[index]
        return offset + min(max(when - start, 0.0), end - start), index


@dataclass(frozen=True)
class Scale:
    """Pixels of an axis: `x(when)` for a time on the plot."""

    axis: ActiveAxis
    left: float
    width: float
    break_px: float

    @classmethod
    def fit(cls, axis: ActiveAxis, left: float, width: float) -> Scale:
        breaks = len(axis.gaps)
        break_px = 22.0 if breaks * 22 <= width / 3 else max(width / 3 / max(breaks, 1), 1.0)
        return cls(axis, left, width, break_px)

    @property
    def per_second(self) -> float:
        usable = self.width - self.break_px * len(self.axis.gaps)
        return usable / max(self.axis.active_seconds, 0.001)

    def x(self, when: float) -> float:
        seconds, breaks = self.axis.position(when)
        return self.left + seconds * self.per_second + breaks * self.break_px

    def x_active(self, seconds: float) -> float:
        """The x of a point `seconds` into the active time (past the breaks before it)."""
        offsets = [segment[2] for segment in self.axis.segments[1:]]
        breaks = bisect.bisect_right(offsets, seconds - 1e-9)
        return self.left + seconds * self.per_second + breaks * self.break_px

    def gap_x(self, index: int) -> float:
        """Left edge of the break of gap `index`."""
        start, end, offset = self.axis.segments[index]
        return self.left + (offset + end - start) * self.per_second + index * self.break_px


def rounded(value: Any, digits: int = 2) -> Any:
    """Floats in nested dicts and lists rounded for drawing: SVG coordinates to a hundredth
    of a pixel (templates print them as they are; floatformat over thousands of them cost
    more than drawing the chart)."""
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v, digits) for v in value]
    return value


def nice_ticks(seconds: float, count: int = 5) -> list[float]:
    """Round tick values (in active seconds) across [0, seconds]."""
    if seconds <= 0:
        return [0.0]
    raw = seconds / count
    steps = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60]
    steps += [120, 300, 600, 900, 1800, 3600, 7200, 14400, 21600, 43200, 86400]
    step = next((s for s in steps if s >= raw), steps[-1])
    ticks, value = [], 0.0
    while value <= seconds + 1e-9:
        ticks.append(value)
        value += step
    return ticks


# --- Checkpoint diffs -------------------------------------------------------------------


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """JSON flattened to path -> leaf, for diffs."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key in sorted(value):
            out.update(flatten(value[key], f"{prefix}.{key}" if prefix else str(key)))
        return out or {prefix: {}}
    if isinstance(value, list):
        out = {}
        for index, item in enumerate(value):
            out.update(flatten(item, f"{prefix}[{index}]"))
        return out or {prefix: []}
    return {prefix: value}


@dataclass(frozen=True)
class DiffLine:
    path: str
    change: str  # added | removed | changed
    before: str
    after: str


def diff_states(before: Any, after: Any) -> list[DiffLine]:
    a, b = flatten(before), flatten(after)
    lines = []
    for path in sorted(set(a) | set(b)):
        if path not in a:
            lines.append(DiffLine(path, "added", "", json.dumps(b[path], default=str)))
        elif path not in b:
            lines.append(DiffLine(path, "removed", json.dumps(a[path], default=str), ""))
        elif a[path] != b[path]:
            lines.append(
                DiffLine(
                    path,
                    "changed",
                    json.dumps(a[path], default=str),
                    json.dumps(b[path], default=str),
                )
            )
    return lines


# --- The audit log ---------------------------------------------------------------------


@dataclass(frozen=True)
class AuditDetail:
    """One key of an audit record's before/after: as a person reads it (text as it is,
    numbers and booleans plainly, anything nested as compact JSON)."""

    key: str
    before: str | None  # None: not in the record's "before"
    after: str | None

    @property
    def changed(self) -> bool:
        return self.before != self.after


def audit_value(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def audit_details(before: Any, after: Any) -> list[AuditDetail]:
    """The keys of a record's before and after, the changed ones first."""
    before = before if isinstance(before, dict) else {"value": before} if before else {}
    after = after if isinstance(after, dict) else {"value": after} if after else {}
    keys = list(dict.fromkeys([*after, *before]))
    details = [
        AuditDetail(
            str(key),
            audit_value(before[key]) if key in before else None,
            audit_value(after[key]) if key in after else None,
        )
        for key in keys
    ]
    return sorted(details, key=lambda d: not d.changed)


def audit_via(meta: Any) -> str:
    """Through what an action came: "dashboard", "api", "cli: start_session, by alice"."""
    if not isinstance(meta, dict):
        return ""
    via = str(meta.get("via") or "")
    extra = []
    if meta.get("command"):
        extra.append(str(meta["command"]))
    if meta.get("os_user"):
        extra.append(f"by {meta['os_user']}")
    return f"{via}: {', '.join(extra)}" if via and extra else via
