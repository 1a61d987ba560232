"""The state a checkpoint carries, and the step records of the trace.

Versions of the stored shape (one line each; a released version is never changed; the
full shapes of every version are written down in `upgraders.py`):
  1: plan, memory refs, counters, budgets, pending approval, uncertain calls, batch cursor,
     agent name/version, final answer; messages as plain `text`, tool results with `ok`.
  2: plan items carry stable ids, counters grouped by model/tools; user, model and operator
     instruction payloads hold content parts, tool results a `status` of "ok" | "error".
  3: the agent's own state, `agent_state`: null | {"version": int, "data": {...}}; a tool
     result may carry the change its call made to it, `agent_state`: {"version", "set",
     "unset"}; a `run_started` system step may carry the whole of it and `agent_version`.

The message history is not part of the state: it is the session's steps. Code outside this
module and `upgraders.py` reads and writes payloads through the helpers at the bottom
(`user_payload`, `model_payload`, `step_text`, `describe_step`, ...), never by their keys.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NotRequired, TypedDict, cast

SCHEMA_VERSION = 3


class StateError(ValueError):
    """A stored blob does not have the shape its schema version promises. `problem` is
    the part a person fixes, naming the field ("budgets.max_steps: expected ...")."""

    def __init__(self, message: str, *, problem: str | None = None) -> None:
        super().__init__(message)
        self.problem = problem or message


class StepKind(enum.StrEnum):
    USER = "user"
    MODEL = "model"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    ERROR = "error"
    OPERATOR = "operator"
    SYSTEM = "system"


class SystemEvent(enum.StrEnum):
    """What a `system` step records (its payload's "event"). The engine writes these;
    integrations (sessions_app.langgraph, sessions_app.openai_agents) add their own."""

    RUN_STARTED = "run_started"
    RUN_FINISHED = "run_finished"  # a foreign runner's run ended (agent_runtime.runners)
    ALREADY_ANSWERED = "already_answered"
    CANCELLED = "cancelled"
    WAITING_FOR_APPROVAL = "waiting_for_approval"
    UNCERTAIN_CALL = "uncertain_call"
    FAN_OUT = "fan_out"
    JOINED = "joined"
    BUDGET_REACHED = "budget_reached"


class OperatorAction(enum.StrEnum):
    """What an `operator` step records (its payload's "action"): a person's word."""

    APPROVE = "approve"
    REJECT = "reject"
    RERUN = "rerun"  # an uncertain call did not happen: run it again
    RECORD_RESULT = "record_result"  # an uncertain call happened: this is its result
    FAIL = "fail"  # fail the session over an uncertain call
    INSTRUCTION = "instruction"
    CORRECT_RESULT = "correct_result"
    ROLLBACK = "rollback"
    CANCEL = "cancel"
    SET_BUDGETS = "set_budgets"
    ANSWER_INTERRUPT = "answer_interrupt"  # a LangGraph interrupt() answered


class SessionStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING_INPUT = "waiting_input"
    PAUSED = "paused"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


RUNNABLE_STATUSES = frozenset({SessionStatus.QUEUED, SessionStatus.RUNNING})
FINAL_STATUSES = frozenset({SessionStatus.COMPLETED, SessionStatus.FAILED, SessionStatus.CANCELLED})


class CheckpointReason(enum.StrEnum):
    AUTO = "auto"
    MANUAL = "manual"
    BEFORE_ROLLBACK = "before-rollback"
    MIGRATION = "migration"


@dataclass
class PlanItem:
    id: str  # stable across plan updates: "p1", "p2", ...
    title: str
    status: str = "pending"  # pending | in_progress | done

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "status": self.status}


def _plan_number(item_id: str) -> int:
    return int(item_id[1:]) if item_id[:1] == "p" and item_id[1:].isdigit() else 0


def replan(old: list[PlanItem], items: list[tuple[str, str]]) -> list[PlanItem]:
    """The plan after an update to (title, status) pairs: an item whose title was already in
    the plan keeps its id, a new one gets the next free id. Deterministic, so a replay after
    a checkpoint gives the same ids as the live run did."""
    free: dict[str, list[str]] = {}
    for item in old:
        free.setdefault(item.title, []).append(item.id)
    next_number = max((_plan_number(item.id) for item in old), default=0) + 1
    plan = []
    for title, status in items:
        ids = free.get(title)
        if ids:
            item_id = ids.pop(0)
        else:
            item_id, next_number = f"p{next_number}", next_number + 1
        plan.append(PlanItem(id=item_id, title=title, status=status))
    return plan


@dataclass
class Counters:
    steps: int = 0
    model_calls: int = 0
    tool_calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    retries: int = 0


@dataclass
class Budgets:
    max_steps: int = 200
    max_tokens: int | None = None
    max_cost: float | None = None


@dataclass
class PendingApproval:
    """A tool call the model asked for that waits for a person's decision."""

    call_id: str
    tool: str
    arguments: dict[str, Any]
    model_seq: int
    requested_at: str | None = None


@dataclass
class SessionState:
    """Everything a resume needs besides the message history (which is the steps)."""

    agent_name: str
    agent_version: str
    plan: list[PlanItem] = field(default_factory=list)
    memory_refs: list[str] = field(default_factory=list)
    counters: Counters = field(default_factory=Counters)
    budgets: Budgets = field(default_factory=Budgets)
    turn: int = 0
    pending_approval: PendingApproval | None = None
    uncertain_calls: list[str] = field(default_factory=list)
    batch_cursor: dict[str, Any] | None = None
    final_answer: str | None = None
    # The agent's own state: {"version": the agent's state version, "data": {...}}; None
    # until a run of an agent that declares one starts it.
    agent_state: dict[str, Any] | None = None

    @property
    def agent_data(self) -> dict[str, Any]:
        """The agent's own state (its data), empty when it keeps none."""
        return (self.agent_state or {}).get("data") or {}

    def to_dict(self) -> dict[str, Any]:
        """Serialise to the current schema version (writers only ever emit that)."""
        c = self.counters
        return {
            "schema_version": SCHEMA_VERSION,
            "agent": {"name": self.agent_name, "version": self.agent_version},
            "turn": self.turn,
            "plan": [item.to_dict() for item in self.plan],
            "memory_refs": list(self.memory_refs),
            "counters": {
                "steps": c.steps,
                "model": {
                    "calls": c.model_calls,
                    "tokens_in": c.tokens_in,
                    "tokens_out": c.tokens_out,
                    "cost": c.cost,
                },
                "tools": {"calls": c.tool_calls, "retries": c.retries},
            },
            "budgets": dataclasses.asdict(self.budgets),
            "pending_approval": (
                dataclasses.asdict(self.pending_approval) if self.pending_approval else None
            ),
            "uncertain_calls": list(self.uncertain_calls),
            "batch_cursor": self.batch_cursor,
            "final_answer": self.final_answer,
            "agent_state": self.agent_state,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SessionState:
        """Build from a blob already upgraded to SCHEMA_VERSION; refuse anything else."""
        if not isinstance(data, dict):
            raise StateError(f"state must be an object, got {type(data).__name__}")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise StateError(
                f"state has schema_version {version!r}; expected {SCHEMA_VERSION} "
                "(load it through agent_runtime.upgraders)"
            )
        top = _fields(
            data,
            "state",
            required=("agent", "plan", "memory_refs", "counters", "budgets", "agent_state"),
            optional=(
                "schema_version",
                "turn",
                "pending_approval",
                "uncertain_calls",
                "batch_cursor",
                "final_answer",
            ),
        )
        agent = _fields(top["agent"], "agent", required=("name", "version"))
        counters = _fields(top["counters"], "counters", required=("steps", "model", "tools"))
        model = _fields(
            counters["model"],
            "counters.model",
            required=("calls", "tokens_in", "tokens_out", "cost"),
        )
        tools = _fields(counters["tools"], "counters.tools", required=("calls", "retries"))
        budgets = _fields(
            top["budgets"], "budgets", optional=("max_steps", "max_tokens", "max_cost")
        )
        pending = top.get("pending_approval")
        if pending is not None:
            pending = _fields(
                pending,
                "pending_approval",
                required=("call_id", "tool", "arguments", "model_seq"),
                optional=("requested_at",),
            )
        plan = top["plan"]
        if not isinstance(plan, list):
            raise _wrong("plan", "a list", plan)
        return cls(
            agent_name=_text(agent["name"], "agent.name"),
            agent_version=_text(agent["version"], "agent.version", numbers=True),
            turn=_whole(top.get("turn", 0), "turn"),
            plan=[_plan_item(item, f"plan[{i}]") for i, item in enumerate(plan)],
            memory_refs=_texts(top["memory_refs"], "memory_refs"),
            counters=Counters(
                steps=_whole(counters["steps"], "counters.steps"),
                model_calls=_whole(model["calls"], "counters.model.calls"),
                tokens_in=_whole(model["tokens_in"], "counters.model.tokens_in"),
                tokens_out=_whole(model["tokens_out"], "counters.model.tokens_out"),
                cost=_amount(model["cost"], "counters.model.cost"),
                tool_calls=_whole(tools["calls"], "counters.tools.calls"),
                retries=_whole(tools["retries"], "counters.tools.retries"),
            ),
            budgets=Budgets(
                max_steps=_whole(budgets.get("max_steps", 200), "budgets.max_steps", minimum=1),
                max_tokens=_maybe(_whole, budgets.get("max_tokens"), "budgets.max_tokens"),
                max_cost=_maybe(_amount, budgets.get("max_cost"), "budgets.max_cost"),
            ),
            pending_approval=None
            if pending is None
            else PendingApproval(
                call_id=_text(pending["call_id"], "pending_approval.call_id"),
                tool=_text(pending["tool"], "pending_approval.tool"),
                arguments=_object(pending["arguments"], "pending_approval.arguments"),
                model_seq=_whole(pending["model_seq"], "pending_approval.model_seq"),
                requested_at=_maybe(
                    _text, pending.get("requested_at"), "pending_approval.requested_at"
                ),
            ),
            uncertain_calls=_texts(top.get("uncertain_calls", []), "uncertain_calls"),
            batch_cursor=_maybe(_object, top.get("batch_cursor"), "batch_cursor"),
            final_answer=_maybe(_text, top.get("final_answer"), "final_answer"),
            agent_state=_agent_state(top["agent_state"]),
        )


# --- Reading a stored state strictly: a wrong type is named, never coerced -----------------


def _wrong(where: str, expected: str, value: Any) -> StateError:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return _mismatch(f"{where}: expected {expected}, got {shown}")


def _mismatch(problem: str) -> StateError:
    return StateError(
        f"state does not match schema version {SCHEMA_VERSION}: {problem}", problem=problem
    )


def _fields(
    value: Any, where: str, *, required: tuple[str, ...] = (), optional: tuple[str, ...] = ()
) -> dict[str, Any]:
    """An object with these keys (the required ones present), and no others."""
    if not isinstance(value, dict):
        raise _wrong(where, "an object", value)
    missing = [k for k in required if k not in value]
    if missing:
        raise _mismatch(f"{where}: missing the key(s) {', '.join(missing)}")
    unknown = sorted(str(k) for k in value if k not in required and k not in optional)
    if unknown:
        known = ", ".join((*required, *optional))
        raise _mismatch(f"{where}: unknown key(s) {', '.join(unknown)} (known: {known})")
    return value


def _whole(value: Any, where: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _wrong(where, f"an integer >= {minimum}", value)
    return value


def _amount(value: Any, where: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or value != value
        or value in (float("inf"), float("-inf"))
        or value < 0
    ):
        raise _wrong(where, "a number >= 0", value)
    return float(value)


def _text(value: Any, where: str, *, numbers: bool = False) -> str:
    if numbers and isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # an agent version written as a number by older code
    if not isinstance(value, str):
        raise _wrong(where, "a string", value)
    return value


def _texts(value: Any, where: str) -> list[str]:
    if not isinstance(value, list):
        raise _wrong(where, "a list of strings", value)
    return [_text(item, f"{where}[{i}]") for i, item in enumerate(value)]


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _wrong(where, "an object", value)
    return value


def _maybe(read: Any, value: Any, where: str) -> Any:
    """`read(value, where)`, or None for None."""
    return None if value is None else read(value, where)


def _plan_item(value: Any, where: str) -> PlanItem:
    item = _fields(value, where, required=("id", "title", "status"))
    return PlanItem(
        id=_text(item["id"], f"{where}.id"),
        title=_text(item["title"], f"{where}.title"),
        status=_text(item["status"], f"{where}.status"),
    )


def _agent_state(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not (
        isinstance(value, dict)
        and set(value) == {"version", "data"}
        and isinstance(value["version"], int)
        and not isinstance(value["version"], bool)
        and value["version"] >= 1
        and isinstance(value["data"], dict)
    ):
        raise StateError("agent_state must be null or {version: int >= 1, data: object}")
    return value


def apply_agent_state_patch(state: SessionState, patch: dict[str, Any]) -> None:
    """Fold one call's change ({"version", "set", "unset"}) into the agent state. A patch
    is always written at the version of the agent state it changed (a run that upgrades
    the agent state records the whole upgraded state first), so a mismatch means the
    trace was written around the engine."""
    current = state.agent_state
    if current is None or current["version"] != patch["version"]:
        found = None if current is None else current["version"]
        raise StateError(
            f"an agent state change at version {patch['version']} cannot apply to the agent "
            f"state at version {found}"
        )
    data = dict(current["data"])
    for key in patch.get("unset") or []:
        data.pop(key, None)
    data.update(copy.deepcopy(patch.get("set") or {}))
    state.agent_state = {"version": current["version"], "data": data}


@dataclass(frozen=True)
class NewStep:
    """A step the loop wants to append; the store assigns its seq."""

    kind: StepKind
    payload: dict[str, Any]
    started_at: datetime | None = None
    finished_at: datetime | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    idempotency_key: str | None = None

    def at(self, seq: int) -> StepRecord:
        """This step as stored at `seq` (in the current schema version)."""
        return StepRecord(
            seq=seq,
            kind=self.kind,
            payload=self.payload,
            started_at=self.started_at,
            finished_at=self.finished_at,
            tokens_in=self.tokens_in,
            tokens_out=self.tokens_out,
            idempotency_key=self.idempotency_key,
        )


@dataclass(frozen=True)
class StepRecord:
    """A stored step, as the engine sees it."""

    seq: int
    kind: StepKind
    payload: dict[str, Any]
    schema_version: int = SCHEMA_VERSION
    started_at: datetime | None = None
    finished_at: datetime | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    idempotency_key: str | None = None
    superseded: bool = False

    @property
    def call_id(self) -> str | None:
        """The tool call a tool_call, tool_result, decision or system step is about."""
        return self.payload.get("call_id")

    @property
    def action(self) -> str | None:
        """An operator step's OperatorAction (None for other kinds)."""
        return step_action(self.kind, self.payload)

    @property
    def event(self) -> str | None:
        """A system step's SystemEvent (None for other kinds)."""
        return step_event(self.kind, self.payload)


def step_action(kind: str, payload: Any) -> str | None:
    """An operator step's OperatorAction (None for other kinds, or a payload without one)."""
    if kind != StepKind.OPERATOR or not isinstance(payload, dict):
        return None
    return as_operator(payload).get("action")


def step_event(kind: str, payload: Any) -> str | None:
    """A system step's SystemEvent (None for other kinds, or a payload without one)."""
    if kind != StepKind.SYSTEM or not isinstance(payload, dict):
        return None
    return as_system(payload).get("event")


@dataclass(frozen=True)
class CheckpointRecord:
    seq: int
    state: SessionState
    reason: CheckpointReason
    schema_version: int = SCHEMA_VERSION


@dataclass(frozen=True)
class NewCheckpoint:
    state: SessionState
    reason: CheckpointReason = CheckpointReason.AUTO


# --- The fields of step payloads ---------------------------------------------------------
# A stored payload is a plain JSON object (StepRecord.payload); these say which fields each
# kind's payload has, by name, once. Writers build one as its TypedDict and store it with
# `stored`; readers see one through its `as_...` view. The stored JSON is what it always was.


class UsagePayload(TypedDict):
    """A model step's `usage`: its tokens, cache tokens and cost."""

    input_tokens: int
    output_tokens: int
    cost: float
    cache_read_tokens: NotRequired[int]
    cache_write_tokens: NotRequired[int]
    unpriced: NotRequired[bool]  # no price known for the model: `cost` is 0


class ToolCallFields(TypedDict):
    """One tool call a model step asks for (an item of its `tool_calls`)."""

    id: str
    name: str
    arguments: dict[str, Any]


class ModelPayload(TypedDict):
    content: list[dict[str, Any]]
    tool_calls: list[ToolCallFields]
    usage: UsagePayload
    model: str


class BranchLabel(TypedDict):
    """Which fan-out branch a call is: `index` of `of`."""

    index: int
    of: int


class ToolCallPayload(TypedDict):
    """A tool call recorded before it runs (its idempotency key is the step's own)."""

    call_id: str
    name: str
    arguments: dict[str, Any]
    branch: NotRequired[BranchLabel]


class PlanUpdateItem(TypedDict):
    title: str
    status: str


class ToolResultPayload(TypedDict):
    call_id: str
    name: str
    status: str  # TOOL_STATUSES
    output: Any
    error: str | None
    attempts: int
    attempt_errors: NotRequired[list[str]]  # the errors of retried attempts, oldest first
    failure: NotRequired[str]  # why a failed call failed (agent_runtime.tools.FAILURE_KINDS)
    plan_update: NotRequired[list[PlanUpdateItem]]
    memory_added: NotRequired[list[str]]
    batch_cursor: NotRequired[dict[str, Any]]
    agent_state: NotRequired[dict[str, Any]]  # the call's change: {"version", "set", "unset"}
    branch: NotRequired[BranchLabel]
    recorded_by_operator: NotRequired[str]  # a person recorded what an uncertain call did


class ErrorPayload(TypedDict, total=False):
    """An `error` step: where it happened and what it was (with details of its own)."""

    where: str
    error: str


class OperatorPayload(TypedDict, total=False):
    """An `operator` step: a person's word (`action`, an OperatorAction) and its details."""

    action: str
    actor: str
    call_id: str  # the pending call a decision is about
    tool: str  # approve, reject: the pending call's tool
    reason: str
    output: Any  # a recorded or corrected result
    note: str
    result_seq: int  # the tool_result step a correction replaces
    name: str  # correct_result: the tool whose result it replaces
    content: list[dict[str, Any]]  # an instruction's text
    budgets: dict[str, Any]
    deadline: str | None  # set_budgets: the session's new wall-time deadline
    while_running: bool  # cancel: a worker was running the session
    checkpoint_seq: int  # rollback: the checkpoint rolled back to
    superseded_steps: int  # rollback: how many steps it superseded
    value: Any  # answer_interrupt: the answer a LangGraph interrupt() resumes with


class SystemPayload(TypedDict, total=False):
    """A `system` step: what the engine did (`event`, a SystemEvent) and its details."""

    event: str
    worker: str
    # run_started
    runner: str
    checkpoint_seq: int | None
    steps_after_checkpoint: int
    schema_version: int | None
    upgraders: list[str]
    step_versions: dict[str, int]
    agent_version: str
    agent_started_on: str | None
    agent_state: dict[str, Any]
    agent_state_upgraders: list[str]
    # waiting_for_approval, uncertain_call
    call_id: str
    tool: str
    arguments: dict[str, Any]
    model_seq: int
    requested_at: str
    tool_call_seq: int
    idempotency_key: str | None
    # fan_out, joined
    owner: str
    token: int
    calls: list[int]
    call_ids: list[str]
    limit: Any  # fan_out: how many branches run at once; budget_reached: the budget's limit
    fan_out_seq: int
    results: int
    # budget_reached
    budget: str
    used: Any
    message: str
    # run_finished
    outcome: str
    final_answer: str
    interrupts: list[dict[str, Any]]  # a LangGraph runner waits for these answers


class PayloadField(enum.StrEnum):
    """Payload fields named as data rather than through a typed view: the fields queries
    filter and select on in the database (sessions_app's `payload__...` lookups), and
    those a page lists. Each is a field of a TypedDict above (checked when this module
    loads), so a renamed field fails loudly instead of matching nothing."""

    ACTION = "action"
    ACTOR = "actor"
    ATTEMPTS = "attempts"
    BRANCH = "branch"
    CALL_ID = "call_id"
    CONTENT = "content"
    COST = "cost"
    ERROR = "error"
    EVENT = "event"
    FAILURE = "failure"
    INDEX = "index"
    MODEL = "model"
    NAME = "name"
    OF = "of"
    OUTPUT = "output"
    PLAN_UPDATE = "plan_update"
    RESULT_SEQ = "result_seq"
    STATUS = "status"
    USAGE = "usage"
    WHERE = "where"
    WORKER = "worker"


PAYLOADS: tuple[Any, ...] = (
    ModelPayload,
    UsagePayload,
    ToolCallFields,
    ToolCallPayload,
    BranchLabel,
    ToolResultPayload,
    ErrorPayload,
    OperatorPayload,
    SystemPayload,
)
if undeclared := {
    f for f in PayloadField if not any(f in typed.__annotations__ for typed in PAYLOADS)
}:
    raise AssertionError(f"payload fields no TypedDict declares: {sorted(undeclared)}")


def stored(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A payload built as one of the TypedDicts above, as the JSON object a step stores."""
    return dict(fields)


def system_step(payload: SystemPayload, *, started_at: datetime | None = None) -> NewStep:
    """A `system` step: what the engine itself records (a run started, a budget reached,
    a fan-out, ...)."""
    return NewStep(kind=StepKind.SYSTEM, payload=stored(payload), started_at=started_at)


def error_payload(where: str, error: str, **details: Any) -> dict[str, Any]:
    """An `error` step's payload: where it happened, what it was, and its details."""
    return {**stored(ErrorPayload(where=where, error=error)), **details}


def as_error(payload: dict[str, Any]) -> ErrorPayload:
    return cast(ErrorPayload, payload)


def as_model(payload: dict[str, Any]) -> ModelPayload:
    return cast(ModelPayload, payload)


def usage_cost(payload: dict[str, Any]) -> float:
    """What a model step's usage says it cost (0 where it reported none)."""
    return float((as_model(payload).get("usage") or {}).get("cost") or 0)


def as_tool_call(payload: dict[str, Any]) -> ToolCallPayload:
    return cast(ToolCallPayload, payload)


def as_tool_result(payload: dict[str, Any]) -> ToolResultPayload:
    return cast(ToolResultPayload, payload)


def as_operator(payload: dict[str, Any]) -> OperatorPayload:
    return cast(OperatorPayload, payload)


def as_system(payload: dict[str, Any]) -> SystemPayload:
    return cast(SystemPayload, payload)


# --- Step payloads of the current version -----------------------------------------------
# Writers build payloads with these; readers go through step_text / describe_step. The
# shapes of every version are documented in upgraders.py.

TOOL_STATUSES = ("ok", "error")


def text_parts(text: str | None) -> list[dict[str, Any]]:
    """Content parts for a text (none for no text at all)."""
    return [] if text is None else [{"type": "text", "text": text}]


def step_text(payload: dict[str, Any]) -> str | None:
    """The text of a user, model or operator instruction payload; None if it has none."""
    texts = [part["text"] for part in payload.get("content") or [] if part.get("type") == "text"]
    return "\n".join(texts) if texts else None


def user_payload(text: str) -> dict[str, Any]:
    return {"content": text_parts(text)}


def model_payload(
    text: str | None, tool_calls: list[dict[str, Any]], usage: Mapping[str, Any], model: str
) -> dict[str, Any]:
    return {"content": text_parts(text), "tool_calls": tool_calls, "usage": usage, "model": model}


def instruction_payload(text: str, actor: str) -> dict[str, Any]:
    """An operator's instruction to the model (shown to it as such, never as the user)."""
    return {"action": OperatorAction.INSTRUCTION, "actor": actor, "content": text_parts(text)}


# The budgets a `set_budgets` operator step may change (the wall-time budget is the session
# row's deadline, not part of the state).
STATE_BUDGETS = ("max_steps", "max_tokens", "max_cost")


def budgets_payload(budgets: dict[str, Any], actor: str, reason: str = "") -> dict[str, Any]:
    """A person (or the program that started the session) sets budgets: each key of
    STATE_BUDGETS present replaces that budget (None lifts a token or cost limit)."""
    payload: dict[str, Any] = {
        "action": OperatorAction.SET_BUDGETS,
        "actor": actor,
        "budgets": {k: budgets[k] for k in STATE_BUDGETS if k in budgets},
    }
    if reason:
        payload["reason"] = reason
    return payload


def apply_budgets(state: SessionState, payload: dict[str, Any]) -> None:
    """Fold a `set_budgets` step into the state's budgets."""
    changes = payload.get("budgets") or {}
    current = dataclasses.asdict(state.budgets)
    for key in STATE_BUDGETS:
        if key in changes:
            current[key] = changes[key]
    state.budgets = Budgets(**current)


def tool_ok(payload: dict[str, Any]) -> bool:
    return payload.get("status") == "ok"


def _check_parts(payload: dict[str, Any], where: str) -> None:
    parts = payload.get("content")
    if not isinstance(parts, list):
        raise StateError(f"{where} payload needs a list of content parts")
    for part in parts:
        if not isinstance(part, dict) or part.get("type") != "text":
            raise StateError(f"{where} payload has an unknown content part: {part!r:.80}")
        if not isinstance(part.get("text"), str):
            raise StateError(f"{where} payload has a text part without a text")


def validate_step_payload(kind: str, payload: Any) -> None:
    """Refuse a payload that does not have the current version's shape for its kind."""
    if not isinstance(payload, dict):
        raise StateError(f"{kind} payload must be an object, got {type(payload).__name__}")
    if kind in (StepKind.USER, StepKind.MODEL):
        _check_parts(payload, kind)
    if kind == StepKind.MODEL:
        calls = payload.get("tool_calls")
        if not isinstance(calls, list) or not all(
            isinstance(c, dict)
            and isinstance(c.get("id"), str)
            and isinstance(c.get("name"), str)
            and isinstance(c.get("arguments"), dict)
            and len(c) == 3
            for c in calls
        ):
            raise StateError("model payload needs tool_calls: [{id, name, arguments}]")
    elif kind == StepKind.TOOL_RESULT:
        if not isinstance(payload.get("call_id"), str) or not isinstance(payload.get("name"), str):
            raise StateError("tool_result payload needs a call_id and a name")
        if payload.get("status") not in TOOL_STATUSES:
            raise StateError(f"tool_result status must be one of {TOOL_STATUSES}")
        plan = payload.get("plan_update")
        if plan is not None and not all(
            isinstance(p, dict) and isinstance(p.get("title"), str) for p in plan
        ):
            raise StateError("tool_result plan_update must be a list of {title, status}")
        cursor = payload.get("batch_cursor")
        if cursor is not None and not (
            isinstance(cursor, dict)
            and isinstance(cursor.get("done"), int)
            and isinstance(cursor.get("total"), int)
        ):
            raise StateError("tool_result batch_cursor must be an object with done and total")
        patch = payload.get("agent_state")
        if patch is not None and not (
            isinstance(patch, dict)
            and isinstance(patch.get("version"), int)
            and isinstance(patch.get("set"), dict)
            and isinstance(patch.get("unset"), list)
            and all(isinstance(k, str) for k in patch["unset"])
        ):
            raise StateError("tool_result agent_state must be {version, set: object, unset: [str]}")
    elif kind == StepKind.OPERATOR and payload.get("action") == OperatorAction.INSTRUCTION:
        _check_parts(payload, "operator instruction")
    elif kind == StepKind.OPERATOR and payload.get("action") == OperatorAction.SET_BUDGETS:
        # The next run folds these into the state: each checked as the state's own budgets
        # are, or every run would fail on them.
        check_budgets_patch(payload.get("budgets"))


def check_budgets_patch(budgets: Any) -> None:
    """Budgets a set_budgets step changes: some of the state's, each a valid limit (None
    lifts a token or cost limit; a step limit always stays). StateError names the field."""
    _fields(budgets, "budgets", optional=STATE_BUDGETS)
    if "max_steps" in budgets:
        _whole(budgets["max_steps"], "budgets.max_steps", minimum=1)
    _maybe(_whole, budgets.get("max_tokens"), "budgets.max_tokens")
    _maybe(_amount, budgets.get("max_cost"), "budgets.max_cost")


def _short(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe_step(kind: str, payload: dict[str, Any]) -> str:
    """One line a person reads in a trace: what was said, called, returned or decided."""
    if kind == StepKind.USER:
        return step_text(payload) or ""
    if kind == StepKind.MODEL:
        calls = ", ".join(c["name"] for c in payload.get("tool_calls") or [])
        text = step_text(payload) or ""
        return f"{text} [calls {calls}]".strip() if calls else text
    if kind == StepKind.TOOL_CALL:
        return f"{payload.get('name')}({_short(payload.get('arguments') or {})})"
    if kind == StepKind.TOOL_RESULT:
        if tool_ok(payload):
            return f"{payload.get('name')}: ok {_short(payload.get('output'))}"
        return f"{payload.get('name')}: error: {_short(payload.get('error'))}"
    if kind == StepKind.ERROR:
        return f"{payload.get('where')}: {payload.get('error')}"
    if kind == StepKind.OPERATOR:
        action = payload.get("action")
        line = f"{payload.get('actor') or 'an operator'}: {action}"
        if action == OperatorAction.INSTRUCTION:
            line += f" {step_text(payload) or ''}"
        if action == OperatorAction.SET_BUDGETS:
            changes = (payload.get("budgets") or {}).items()
            line += " " + ", ".join(f"{k}={'none' if v is None else v}" for k, v in changes)
        if payload.get("reason"):
            line += f" ({payload['reason']})"
        return line
    return str(payload.get("event") or "")
