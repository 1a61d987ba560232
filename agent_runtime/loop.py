"""The agent loop: claim, load, think, act, checkpoint, repeat.

What happens next is always derived from the durable trace (`next_action`), never from
in-memory flags, so a run that starts after a crash continues exactly where the last
committed step left off. The state is a fold of the steps over the head checkpoint
(`apply_step`), applied the same way live and on resume.
"""

from __future__ import annotations

import contextlib
import copy
import enum
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from .agents import Agent, AgentRegistry, AgentStateError, UnknownAgent
from .pricing import PriceTable, load_price_table
from .providers import Message, ModelSettings, ModelTurn, Provider, ProviderError, ToolCall
from .providers import make_provider as default_make_provider
from .providers.base import Usage
from .records import RecordSource
from .redaction import NO_REDACTION, Redactor
from .state import (
    Budgets,
    NewCheckpoint,
    NewStep,
    OperatorAction,
    PendingApproval,
    SessionState,
    SessionStatus,
    StateError,
    StepKind,
    StepRecord,
    SystemEvent,
    apply_agent_state_patch,
    apply_budgets,
    model_payload,
    replan,
    step_text,
    tool_ok,
)
from .store import EffectLedger, Lease, LeaseLost, SessionHead, SessionStore, utcnow
from .telemetry import (
    NO_TELEMETRY,
    ModelCallRecord,
    RunRecord,
    Telemetry,
    ToolCallRecord,
    guarded,
    observe,
)
from .tools import FenceGuard, Tool, ToolContext, ToolOutcome, TransientRetry
from .upgraders import IncompatibleSchemaError

log = logging.getLogger("respawn.loop")

ProviderFactory = Callable[[str, dict[str, Any]], tuple[Provider, str]]

# How the error of a session paused by a budget starts (the dashboard's "needs attention"
# finds them by it).
BUDGET_REACHED = "budget reached"


@dataclass(frozen=True)
class RunConfig:
    worker_id: str
    lease_ttl: float = 10.0
    heartbeat_interval: float | None = None  # default: a third of the lease TTL
    model_retries: int = 3
    model_backoff: float = 0.5
    model_backoff_max: float = 8.0
    model_timeout: float = 60.0
    model_override: str | None = None  # RESPAWN_MODEL: replaces every agent's model
    provider_options: dict[str, Any] = field(default_factory=dict)
    tool_options: dict[str, Any] = field(default_factory=dict)
    # Applied to every payload (and so every state) before it is stored.
    redactor: Redactor = NO_REDACTION
    # Fail a session whose worker died this many times in a row at the same step.
    max_crashes: int = 5
    # A fan-out branch dispatched this many times without a result (its worker kept dying)
    # gets an error result the model sees instead of another try.
    max_branch_attempts: int = 3
    # What model calls cost when their provider does not say (agent_runtime.pricing).
    prices: PriceTable = field(default_factory=lambda: load_price_table(""))
    # Where runs, model and tool calls and writes are reported (agent_runtime.telemetry).
    telemetry: Telemetry = NO_TELEMETRY
    # How a tool call that failed on the infrastructure (database, Redis, network) is
    # retried, and which errors count as such.
    transient: TransientRetry = field(default_factory=TransientRetry)


class Outcome(enum.StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    WAITING_INPUT = "waiting_input"
    CANCELLED = "cancelled"
    LEASE_LOST = "lease_lost"
    NOT_CLAIMED = "not_claimed"
    INCOMPATIBLE = "incompatible"
    # A budget was reached: paused with the reason until someone raises it and resumes.
    PAUSED = "paused"
    # The turn's tool calls were handed to branch jobs; `RunResult.branches` says which.
    FANNED_OUT = "fanned_out"


@dataclass(frozen=True)
class RunResult:
    session_id: str
    outcome: Outcome
    final_answer: str | None = None
    error: str | None = None
    branches: tuple[int, ...] = ()  # FANNED_OUT: seqs of the tool calls to run as branch jobs


# --- Reading the trace ------------------------------------------------------------------


@dataclass(frozen=True)
class CallModel:
    pass


@dataclass(frozen=True)
class PendingCall:
    call: ToolCall
    tool_call_step: StepRecord | None  # recorded before a crash: run again with its key
    decision: dict[str, Any] | None  # an operator's approve/reject for this call


@dataclass(frozen=True)
class RunTools:
    model_seq: int
    calls: list[PendingCall]


@dataclass(frozen=True)
class Finished:
    answer: str | None


Action = CallModel | RunTools | Finished

# Operator steps that give the model something new to respond to (a person's edit).
_NEW_INPUT_OPERATOR_ACTIONS = {OperatorAction.INSTRUCTION, OperatorAction.CORRECT_RESULT}
# A person's word on one pending tool call: approve/reject a call that needs approval;
# rerun/record_result an uncertain one (a non-idempotent call a crash left without result).
DECISIONS = {
    OperatorAction.APPROVE,
    OperatorAction.REJECT,
    OperatorAction.RERUN,
    OperatorAction.RECORD_RESULT,
}
UNCERTAIN_RESOLUTIONS = {OperatorAction.RERUN, OperatorAction.RECORD_RESULT}


def _is_new_input(step: StepRecord) -> bool:
    return step.kind == StepKind.USER or (
        step.kind == StepKind.OPERATOR and step.payload.get("action") in _NEW_INPUT_OPERATOR_ACTIONS
    )


def next_action(history: list[StepRecord]) -> Action:
    """Decide what the session does next from its live history alone."""
    last_model = None
    for index in range(len(history) - 1, -1, -1):
        step = history[index]
        if _is_new_input(step):
            return CallModel()
        if step.kind == StepKind.MODEL:
            last_model = index
            break
    if last_model is None:
        return CallModel()
    model_step = history[last_model]
    calls = [ToolCall(**c) for c in model_step.payload.get("tool_calls") or []]
    if not calls:
        return Finished(step_text(model_step.payload))
    after = history[last_model + 1 :]
    results = {s.payload.get("call_id") for s in after if s.kind == StepKind.TOOL_RESULT}
    recorded = {s.payload.get("call_id"): s for s in after if s.kind == StepKind.TOOL_CALL}
    decisions = {
        s.payload.get("call_id"): {**s.payload, "_seq": s.seq}
        for s in after
        if s.kind == StepKind.OPERATOR and s.payload.get("action") in DECISIONS
    }
    pending = [
        PendingCall(call=c, tool_call_step=recorded.get(c.id), decision=decisions.get(c.id))
        for c in calls
        if c.id not in results
    ]
    if not pending:
        return CallModel()
    return RunTools(model_seq=model_step.seq, calls=pending)


def _uncertain_resolution(pending: PendingCall) -> dict[str, Any] | None:
    """A person's rerun/record_result for a call recorded before a crash, made after it."""
    decision = pending.decision
    if (
        decision is None
        or pending.tool_call_step is None
        or decision.get("action") not in UNCERTAIN_RESOLUTIONS
        or decision.get("_seq", 0) <= pending.tool_call_step.seq
    ):
        return None
    return decision


def apply_step(state: SessionState, step: StepRecord) -> None:
    """Fold one step into the state (used live and when replaying after a checkpoint)."""
    payload = step.payload
    state.counters.steps += 1
    if step.kind == StepKind.USER:
        state.final_answer = None
    elif step.kind == StepKind.MODEL:
        state.turn += 1
        state.counters.model_calls += 1
        state.counters.tokens_in += step.tokens_in
        state.counters.tokens_out += step.tokens_out
        state.counters.cost += float((payload.get("usage") or {}).get("cost") or 0.0)
        if not payload.get("tool_calls"):
            state.final_answer = step_text(payload)
    elif step.kind == StepKind.TOOL_RESULT:
        state.counters.tool_calls += 1
        state.counters.retries += max(0, int(payload.get("attempts") or 1) - 1)
        if payload.get("plan_update") is not None:
            state.plan = replan(
                state.plan, [(item["title"], item["status"]) for item in payload["plan_update"]]
            )
        if isinstance(payload.get("batch_cursor"), dict):
            state.batch_cursor = dict(payload["batch_cursor"])
        for ref in payload.get("memory_added") or []:
            if ref not in state.memory_refs:
                state.memory_refs.append(ref)
        if state.pending_approval and state.pending_approval.call_id == payload.get("call_id"):
            state.pending_approval = None
        if payload.get("call_id") in state.uncertain_calls:
            state.uncertain_calls.remove(payload["call_id"])
        if payload.get("agent_state") is not None:
            apply_agent_state_patch(state, payload["agent_state"])
    elif step.kind == StepKind.OPERATOR and payload.get("action") == OperatorAction.SET_BUDGETS:
        apply_budgets(state, payload)
    elif step.kind == StepKind.SYSTEM and payload.get("event") == SystemEvent.RUN_STARTED:
        if payload.get("agent_version"):
            state.agent_version = str(payload["agent_version"])
        if payload.get("agent_state") is not None:
            state.agent_state = copy.deepcopy(payload["agent_state"])
    elif step.kind == StepKind.SYSTEM and payload.get("event") == SystemEvent.UNCERTAIN_CALL:
        if payload["call_id"] not in state.uncertain_calls:
            state.uncertain_calls.append(payload["call_id"])
    elif step.kind == StepKind.SYSTEM and payload.get("event") == SystemEvent.WAITING_FOR_APPROVAL:
        state.pending_approval = PendingApproval(
            call_id=payload["call_id"],
            tool=payload["tool"],
            arguments=payload["arguments"],
            model_seq=payload["model_seq"],
            requested_at=payload.get("requested_at"),
        )


def new_state(agent: Agent) -> SessionState:
    """The state of a session that has no checkpoint yet: the agent's limits as budgets."""
    limits = agent.limits
    return SessionState(
        agent_name=agent.name,
        agent_version=agent.version,
        budgets=Budgets(
            max_steps=limits.max_steps, max_tokens=limits.max_tokens, max_cost=limits.max_cost
        ),
    )


def replay(head: SessionHead, agent: Agent) -> SessionState:
    """The state at the end of the loaded history: the head checkpoint's, with every step
    after it folded in. Raises StateError when a step cannot be folded."""
    state = (
        copy.deepcopy(head.checkpoint.state) if head.checkpoint is not None else new_state(agent)
    )
    for step in head.steps_after_checkpoint:
        apply_step(state, step)
    return state


def start_agent_state(
    agent: Agent, state: SessionState
) -> tuple[dict[str, Any] | None, tuple[str, ...]]:
    """Load the agent's own state for a run, upgraded to the agent's state version.
    Returns the whole agent state when the run must record it (it is new, or upgraders
    were applied), and the upgraders applied. Raises AgentStateError when this code
    cannot load it."""
    if agent.state is None:
        return None, ()
    try:
        loaded, applied = agent.state.load(state.agent_state)
    except AgentStateError as exc:
        raise AgentStateError(f"agent {agent.name!r}: {exc}") from exc
    record = state.agent_state is None or bool(applied)
    state.agent_state = loaded
    return (loaded if record else None), applied


def build_messages(system_prompt: str, history: list[StepRecord]) -> list[Message]:
    """The conversation a provider sees, rebuilt from durable steps only (already upgraded
    to the current schema). A session stored in an older version renders exactly as it did
    then: tests hold every version's fixtures to that."""
    return Conversation(system_prompt, history).messages


def _corrections(history: list[StepRecord]) -> dict[Any, dict[str, Any]]:
    return {
        s.payload.get("result_seq"): s.payload
        for s in history
        if s.kind == StepKind.OPERATOR and s.payload.get("action") == OperatorAction.CORRECT_RESULT
    }


def _step_message(step: StepRecord, corrections: dict[Any, dict[str, Any]]) -> Message | None:
    """What one step shows the model, if anything."""
    payload = step.payload
    if step.kind == StepKind.USER:
        return Message(role="user", content=step_text(payload) or "")
    if step.kind == StepKind.MODEL:
        return Message(
            role="assistant",
            content=step_text(payload),
            tool_calls=tuple(ToolCall(**c) for c in payload.get("tool_calls") or []),
        )
    if step.kind == StepKind.TOOL_RESULT:
        # The model has always been shown {"ok": bool, ...}; the stored status is mapped
        # back so sessions read the same to a model across the v1 -> v2 change.
        result = {
            "name": payload.get("name"),
            "ok": tool_ok(payload),
            "output": payload.get("output"),
            "error": payload.get("error"),
            "attempts": payload.get("attempts", 1),
        }
        if payload.get("recorded_by_operator"):
            result["recorded_by_operator"] = payload["recorded_by_operator"]
        correction = corrections.get(step.seq)
        if correction is not None:
            # The corrected value, labelled as an operator's: never passed off as the tool's.
            result.update(ok=True, output=correction.get("output"), error=None)
            result["corrected_by_operator"] = correction.get("actor")
            if correction.get("note"):
                result["operator_note"] = correction["note"]
        content = json.dumps(result, sort_keys=True, default=str)
        return Message(
            role="tool",
            content=content,
            tool_call_id=payload.get("call_id"),
            name=payload.get("name"),
        )
    if step.kind == StepKind.OPERATOR and payload.get("action") == OperatorAction.CORRECT_RESULT:
        return Message(
            role="user",
            content=(
                f"[Operator correction] The result of tool call {payload.get('call_id')} "
                "was corrected by an operator; continue from the corrected result."
            ),
        )
    if step.kind == StepKind.OPERATOR and payload.get("action") == OperatorAction.INSTRUCTION:
        # Marked as coming from an operator, never passed off as the model or a tool.
        return Message(role="user", content=f"[Operator instruction] {step_text(payload) or ''}")
    return None


class _OpenCalls:
    """Gives every tool call that never got a result (new input arrived first, e.g. after a
    rollback to a pending approval) an explicit "not run" result, right where the
    conversation moved on. Both provider APIs refuse a tool call left unanswered."""

    def __init__(self) -> None:
        self.open: dict[str, str] = {}

    def push(self, message: Message, out: list[Message]) -> None:
        if message.role == "tool":
            self.open.pop(message.tool_call_id or "", None)
        elif self.open:
            for call_id, name in self.open.items():
                content = json.dumps(
                    {
                        "name": name,
                        "ok": False,
                        "output": None,
                        "attempts": 0,
                        "error": "not run: the conversation moved on before this call ran",
                    },
                    sort_keys=True,
                )
                out.append(Message(role="tool", content=content, tool_call_id=call_id, name=name))
            self.open = {}
        if message.role == "assistant":
            self.open = {c.id: c.name for c in message.tool_calls}
        out.append(message)


def _answer_abandoned_calls(messages: list[Message]) -> list[Message]:
    out: list[Message] = []
    open_calls = _OpenCalls()
    for message in messages:
        open_calls.push(message, out)
    return out


class Conversation:
    """build_messages, kept up to date as a run appends steps: each step is rendered once,
    not once per model call (which made a long session quadratic in its length).

    `messages` is always equal to build_messages(system_prompt, history) over the steps
    given so far. A step that changes how earlier steps render (an operator's correction)
    rebuilds it; a run itself never appends one."""

    def __init__(self, system_prompt: str, history: list[StepRecord]) -> None:
        # The agent's instructions may change from call to call (a function of the
        # state): set before reading `messages`.
        self.system_prompt = system_prompt
        self._history = list(history)
        self._rebuild()

    def _rebuild(self) -> None:
        self._corrections = _corrections(self._history)
        self._open_calls = _OpenCalls()
        self._messages: list[Message] = []
        for step in self._history:
            self._render(step)

    def _render(self, step: StepRecord) -> None:
        message = _step_message(step, self._corrections)
        if message is not None:
            self._open_calls.push(message, self._messages)

    def add(self, step: StepRecord) -> None:
        self._history.append(step)
        if (
            step.kind == StepKind.OPERATOR
            and step.payload.get("action") == OperatorAction.CORRECT_RESULT
        ):
            self._rebuild()
        else:
            self._render(step)

    @property
    def messages(self) -> list[Message]:
        system = [Message(role="system", content=self.system_prompt)] if self.system_prompt else []
        return system + self._messages


# --- The lease heartbeat ----------------------------------------------------------------


class Heartbeat:
    """Keeps the lease alive from a background thread while a model call or tool runs, and
    knows, by this worker's own clock, until when the lease is surely still the run's.

    `since` is the monotonic time just before the lease was taken or last renewed: the
    lease runs out no earlier than `since + ttl` wherever it is looked at (clocks in sync
    to well under the TTL, as the lease protocol already requires)."""

    def __init__(
        self,
        store: SessionStore,
        lease: Lease,
        ttl: float,
        interval: float,
        since: float | None = None,
    ) -> None:
        self._store = store
        self._lease = lease
        self._ttl = ttl
        self._interval = interval
        self._stop = threading.Event()
        self.lost = threading.Event()
        self.cancel_requested = False
        self.valid_until = (time.monotonic() if since is None else since) + ttl
        self._thread = threading.Thread(target=self._run, name="respawn-heartbeat", daemon=True)

    def ensure(self) -> None:
        """Raise LeaseLost unless the run still holds its lease: before a tool call
        starts, so that a worker that froze past its lease (a stopped process, a long
        pause) never starts one after another worker may have taken the session over.
        Past the expiry by this clock, or close to it, the lease is renewed first (it
        is still the run's if nobody took it: the token decides)."""
        if self.lost.is_set():
            raise LeaseLost(f"session {self._lease.session_id}: the lease was fenced off")
        if time.monotonic() < self.valid_until - self._ttl / 10:
            return
        sent = time.monotonic()
        try:
            result = self._store.heartbeat(self._lease, self._ttl)
        except Exception as exc:
            raise LeaseLost(
                f"session {self._lease.session_id}: the lease ran out by this worker's clock "
                f"and could not be renewed ({type(exc).__name__}: {exc})"
            ) from exc
        if not result.alive:
            self.lost.set()
            raise LeaseLost(
                f"session {self._lease.session_id}: the lease ran out by this worker's clock "
                "and another holder has it"
            )
        self.valid_until = sent + self._ttl

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self._interval + 5)

    def _run(self) -> None:
        cleanup = getattr(self._store, "thread_cleanup", None)
        last_error, last_logged = "", 0.0
        try:
            while not self._stop.wait(self._interval):
                sent = time.monotonic()
                try:
                    result = self._store.heartbeat(self._lease, self._ttl)
                except Exception as exc:  # retried; the lease TTL is the bound
                    # The same error again (the database down) is logged once a minute.
                    error = f"{type(exc).__name__}: {exc}"
                    if error != last_error or sent - last_logged >= 60:
                        log.warning("heartbeat for %s failed: %s", self._lease.session_id, error)
                        last_error, last_logged = error, sent
                    continue
                last_error = ""
                self.cancel_requested = result.cancel_requested
                if not result.alive:
                    self.lost.set()
                    return
                self.valid_until = sent + self._ttl
        finally:
            if cleanup is not None:
                cleanup()


# --- The run ----------------------------------------------------------------------------


class _Stop(Exception):
    def __init__(self, result: RunResult) -> None:
        self.result = result


class _Run:
    def __init__(
        self,
        *,
        store: SessionStore,
        agent: Agent,
        effects: EffectLedger,
        config: RunConfig,
        lease: Lease,
        records: RecordSource | None = None,
        head: SessionHead,
        make_provider: ProviderFactory,
    ) -> None:
        self.store = store
        self.agent = agent
        self.effects = effects
        self.records = records
        self.config = config
        self.lease = lease
        self.session_id = head.session_id
        # From the last model step on (load_tail): all that deciding the next action, the
        # fan-out and the uncertain calls read. The whole conversation is loaded when the
        # model is next called, not before the run's first step.
        self.history = list(head.history)
        # The instructions are rendered from the state before each model call.
        self._conversation = Conversation("", self.history) if head.history_from <= 1 else None
        self.last_seq = head.last_seq
        self.make_provider = make_provider
        self.heartbeat: Heartbeat | None = None
        self.started_on = head.agent_version
        self.deadline = head.deadline
        self.record = RunRecord(head.session_id, agent.name, agent.version, config.worker_id)
        self.state = replay(head, agent)

    # -- writing -------------------------------------------------------------------------
    def append(
        self,
        step: NewStep,
        *,
        checkpoint: bool = False,
        status: SessionStatus | None = None,
        error: str | None = None,
        release: bool = False,
    ) -> StepRecord:
        return self.append_all(
            [step], checkpoint=checkpoint, status=status, error=error, release=release
        )[0]

    def append_all(
        self,
        steps: list[NewStep],
        *,
        checkpoint: bool = False,
        status: SessionStatus | None = None,
        error: str | None = None,
        release: bool = False,
    ) -> list[StepRecord]:
        if self.heartbeat is not None and self.heartbeat.lost.is_set():
            raise LeaseLost(f"session {self.session_id}: heartbeat found the lease fenced off")
        # Secrets never reach the store: redact first, then fold the redacted step into the
        # state, so the checkpoint written with it is redacted as well.
        steps = [replace(s, payload=self.config.redactor.redact(s.payload)) for s in steps]
        records = [
            StepRecord(
                seq=self.last_seq + 1 + index,
                kind=step.kind,
                payload=step.payload,
                started_at=step.started_at,
                finished_at=step.finished_at,
                tokens_in=step.tokens_in,
                tokens_out=step.tokens_out,
                idempotency_key=step.idempotency_key,
            )
            for index, step in enumerate(steps)
        ]
        # With a checkpoint, fold first so the checkpoint written with these steps already
        # includes them (and keep the state before, for a failed write). Without one the
        # fold waits for the commit: no copy of the state on every step.
        state_before = None
        new_checkpoint = None
        if checkpoint:
            # Its serialised form, the checkpoint's own format: five times cheaper than a
            # deep copy, and turned back into a state only if the write fails.
            state_before = self.state.to_dict()
            for record in records:
                apply_step(self.state, record)
            new_checkpoint = NewCheckpoint(state=self.state)
        began = time.perf_counter()
        try:
            result = self.store.append(
                self.lease,
                steps,
                checkpoint=new_checkpoint,
                status=status,
                error=error,
                release=release,
            )
        except Exception:
            if state_before is not None:
                self.state = SessionState.from_dict(state_before)
            raise
        if not checkpoint:
            for record in records:
                apply_step(self.state, record)
        expected = [r.seq for r in records]
        if result.seqs != expected:
            # Only the lease holder writes, so seqs are predictable; anything else means
            # someone wrote around the fence.
            raise LeaseLost(
                f"session {self.session_id}: expected seqs {expected}, got {result.seqs}"
            )
        self.last_seq = records[-1].seq
        guarded(
            self.config.telemetry.steps_written,
            self.record,
            [r.kind for r in records],
            time.perf_counter() - began,
            self.last_seq if checkpoint else None,
        )
        self.history.extend(records)
        if self._conversation is not None:
            for record in records:
                self._conversation.add(record)
        if result.cancel_requested and not release:
            self.stop_cancelled()
        return records

    @property
    def conversation(self) -> Conversation:
        """The conversation the model sees, over the whole live history: loaded from the
        store the first time it is needed in a run that started from a tail, then kept up
        to date as steps are appended."""
        if self._conversation is None:
            try:
                history = self.store.load_history(self.session_id)
            except IncompatibleSchemaError as exc:
                # A step before the tail that this code cannot read after all (a payload
                # at the current version but malformed): stop as load_head would have.
                self.store.release(self.lease)
                raise _Stop(
                    RunResult(self.session_id, Outcome.INCOMPATIBLE, error=str(exc))
                ) from exc
            self._conversation = Conversation("", history)
        return self._conversation

    def _scrub(self, text: str) -> str:
        """Keep configured secrets out of recorded errors, whatever a provider raised."""
        for name, value in self.config.provider_options.items():
            if "key" in name and isinstance(value, str) and len(value) >= 8:
                text = text.replace(value, "[redacted]")
        return text

    def stop_cancelled(self) -> None:
        """The cooperative stop: the session's `cancel_requested` flag (set in the admin)
        came back with a heartbeat or an append; the step in hand is recorded, the run ends
        here with a `cancelled` step. (The operator's cancel fences the run off instead.)"""
        self.append(
            NewStep(
                kind=StepKind.SYSTEM,
                payload={"event": SystemEvent.CANCELLED, "worker": self.config.worker_id},
            ),
            checkpoint=False,
            status=SessionStatus.CANCELLED,
            release=True,
        )
        raise _Stop(RunResult(self.session_id, Outcome.CANCELLED))

    def fail(self, where: str, message: str, **details: Any) -> None:
        self.append(
            NewStep(kind=StepKind.ERROR, payload={"where": where, "error": message, **details}),
            status=SessionStatus.FAILED,
            error=message,
            release=True,
        )
        raise _Stop(RunResult(self.session_id, Outcome.FAILED, error=message))

    # -- the turn ------------------------------------------------------------------------
    def run(
        self,
        head: SessionHead,
        agent_state: dict[str, Any] | None = None,
        agent_state_upgraders: tuple[str, ...] = (),
    ) -> RunResult:
        payload: dict[str, Any] = {
            "event": SystemEvent.RUN_STARTED,
            "worker": self.config.worker_id,
            "checkpoint_seq": head.checkpoint.seq if head.checkpoint else None,
            "steps_after_checkpoint": len(head.steps_after_checkpoint),
            "schema_version": (head.checkpoint.schema_version if head.checkpoint else None),
            "upgraders": list(head.upgraders_applied),
            # Stored version -> how many of the loaded steps were stored in it.
            "step_versions": {str(v): n for v, n in sorted(head.step_versions.items())},
            # The agent version running it, beside the one the session started on.
            "agent_version": self.agent.version,
            "agent_started_on": head.agent_version or None,
        }
        if agent_state is not None:
            # New or upgraded: recorded whole, so every change after it is at its version.
            payload["agent_state"] = agent_state
            payload["agent_state_upgraders"] = list(agent_state_upgraders)
        self.append(NewStep(kind=StepKind.SYSTEM, payload=payload, started_at=utcnow()))
        while True:
            if self.heartbeat is not None and self.heartbeat.cancel_requested:
                self.stop_cancelled()
            action = next_action(self.history)
            if isinstance(action, Finished):
                # A run that finds the turn already answered (e.g. a crash after the final
                # step's commit but before the status change cannot happen: they are one
                # transaction) simply settles the status.
                self.append(
                    NewStep(kind=StepKind.SYSTEM, payload={"event": SystemEvent.ALREADY_ANSWERED}),
                    checkpoint=True,
                    status=SessionStatus.COMPLETED,
                    release=True,
                )
                return RunResult(self.session_id, Outcome.COMPLETED, final_answer=action.answer)
            if isinstance(action, CallModel):
                answer = self.call_model()
                if answer is not None:
                    return answer
            else:
                paused = self.run_tools(action)
                if paused is not None:
                    return paused

    def check_budgets(self) -> None:
        """Pause the session, with the reason, when it has used up a budget."""
        budgets, counters = self.state.budgets, self.state.counters
        if counters.steps >= budgets.max_steps:
            self.pause_for_budget(
                "steps",
                f"step limit of {budgets.max_steps} reached",
                limit=budgets.max_steps,
                used=counters.steps,
            )
        tokens = counters.tokens_in + counters.tokens_out
        if budgets.max_tokens is not None and tokens >= budgets.max_tokens:
            self.pause_for_budget(
                "tokens",
                f"token limit of {budgets.max_tokens} reached ({tokens} used)",
                limit=budgets.max_tokens,
                used=tokens,
            )
        if budgets.max_cost is not None and counters.cost >= budgets.max_cost:
            self.pause_for_budget(
                "cost",
                f"cost limit of {budgets.max_cost:g} reached ({counters.cost:g} spent)",
                limit=budgets.max_cost,
                used=round(counters.cost, 6),
            )
        if self.deadline is not None and utcnow() >= self.deadline:
            self.pause_for_budget(
                "time",
                f"wall-time limit reached (the deadline was {self.deadline:%Y-%m-%d %H:%M:%S} UTC)",
                limit=self.deadline.isoformat(),
                used=utcnow().isoformat(),
            )

    def pause_for_budget(self, budget: str, message: str, *, limit: Any, used: Any) -> None:
        """A budget is used up: not a failure. The session pauses with the reason (shown
        in "needs attention"); raising the budget and resuming continues it here."""
        error = f"{BUDGET_REACHED}: {message}"
        guarded(self.config.telemetry.budget_reached, self.record, budget)
        self.append(
            NewStep(
                kind=StepKind.SYSTEM,
                payload={
                    "event": SystemEvent.BUDGET_REACHED,
                    "budget": budget,
                    "limit": limit,
                    "used": used,
                    "message": message,
                },
            ),
            checkpoint=True,
            status=SessionStatus.PAUSED,
            error=error,
            release=True,
        )
        raise _Stop(RunResult(self.session_id, Outcome.PAUSED, error=error))

    def call_model(self) -> RunResult | None:
        self.check_budgets()
        spec = self.config.model_override or self.agent.model
        try:
            provider, model_name = self.make_provider(spec, self.config.provider_options)
        except (ValueError, ProviderError) as exc:
            self.fail("model", f"cannot use model {spec!r}: {exc}", model=spec, permanent=True)
        settings = ModelSettings(model=model_name, timeout=self.config.model_timeout)
        conversation = self.conversation
        try:
            conversation.system_prompt = self.agent.render_instructions(self.state)
        except Exception as exc:  # the agent's own code: its failure is the session's
            self.fail(
                "agent",
                f"the instructions of agent {self.agent.name!r} raised {type(exc).__name__}: {exc}",
                permanent=True,
            )
        messages = conversation.messages
        started = utcnow()
        call = ModelCallRecord(self.record, spec.partition(":")[0], model_name)
        with observe(self.config.telemetry, "model_call", call):
            turn = self._complete_with_retries(provider, messages, settings, spec)
            usage = usage_record(turn.usage, self.config.prices, spec, model_name)
            call.input_tokens = turn.usage.input_tokens
            call.output_tokens = turn.usage.output_tokens
            call.cache_read_tokens = turn.usage.cache_read_tokens
            call.cache_write_tokens = turn.usage.cache_write_tokens
            call.cost = None if usage.get("unpriced") else usage["cost"]
            call.finish = "tool_calls" if turn.tool_calls else "stop"
        payload = model_payload(turn.text, [c.to_dict() for c in turn.tool_calls], usage, spec)
        step = NewStep(
            kind=StepKind.MODEL,
            payload=payload,
            started_at=started,
            finished_at=utcnow(),
            tokens_in=turn.usage.input_tokens,
            tokens_out=turn.usage.output_tokens,
        )
        if not turn.tool_calls:
            self.append(step, checkpoint=True, status=SessionStatus.COMPLETED, release=True)
            return RunResult(self.session_id, Outcome.COMPLETED, final_answer=turn.text)
        self.append(step)
        return None

    def _complete_with_retries(
        self, provider: Provider, messages: list[Message], settings: ModelSettings, spec: str
    ) -> ModelTurn:
        limits = self.agent.limits
        retries = (
            limits.max_model_retries
            if limits.max_model_retries is not None
            else self.config.model_retries
        )
        attempt = 0
        while True:
            attempt += 1
            try:
                return provider.complete(messages, self.agent.tools.specs(), settings)
            except ProviderError as exc:
                error, permanent = exc, exc.permanent
            except Exception as exc:  # an SDK's unexpected error: retry, it may be transient
                error, permanent = exc, False
            if self.heartbeat is not None and self.heartbeat.lost.is_set():
                raise LeaseLost(f"session {self.session_id}: lease lost during the model call")
            if permanent or attempt > retries:
                self.fail(
                    "model",
                    f"model call failed after {attempt} attempt(s): {self._scrub(str(error))}",
                    model=spec,
                    attempts=attempt,
                    permanent=permanent,
                    error_type=type(error).__name__,
                )
            delay = min(
                self.config.model_backoff * (2 ** (attempt - 1)), self.config.model_backoff_max
            )
            log.info(
                "model call for %s failed (%s); retry %d in %.2fs",
                self.session_id,
                error,
                attempt,
                delay,
            )
            time.sleep(delay)

    def can_fan_out(self, action: RunTools) -> bool:
        """Several calls, an agent that allows parallel branches, and nothing a person must
        decide: only tools that may simply run again (idempotent, no approval) fan out, so a
        branch re-run after a crash is as safe as a sequential re-run."""
        if self.agent.limits.max_parallel_tools <= 1 or len(action.calls) <= 1:
            return False
        for pending in action.calls:
            tool = self.agent.tools.get(pending.call.name)
            if tool is None or tool.needs_approval or not tool.idempotent:
                return False
            if pending.decision is not None:
                return False
        return True

    def fan_out(self, action: RunTools) -> RunResult | None:
        """Record every call of the turn (one append) and a `fan_out` step naming them and
        the lease the branches write under; the job enqueues the first wave of branches.

        The lease is not released: the branches heartbeat it while they run and the one
        that records the turn's last result releases it with a checkpoint (the join). If
        every branch is lost, the lease expires, the reconciler runs the session again, and
        this finds the unanswered calls and fans them out anew (a new token fences off
        any branch of the old wave that is still going)."""
        fan_outs = [
            s
            for s in self.history
            if s.seq > action.model_seq
            and s.kind == StepKind.SYSTEM
            and s.payload.get("event") == SystemEvent.FAN_OUT
        ]
        limit = self.agent.limits.max_parallel_tools
        new_calls = [p for p in action.calls if p.tool_call_step is None]
        if new_calls:
            now = utcnow()
            self.append_all(
                [
                    NewStep(
                        kind=StepKind.TOOL_CALL,
                        payload={
                            "call_id": p.call.id,
                            "name": p.call.name,
                            "arguments": p.call.arguments,
                            # Which branch of how many: the trace shows them side by side.
                            "branch": {"index": index + 1, "of": len(new_calls)},
                        },
                        started_at=now,
                        idempotency_key=f"{self.session_id}:{self.last_seq + 1 + index}",
                    )
                    for index, p in enumerate(new_calls)
                ]
            )
        recorded = {
            s.payload.get("call_id"): s
            for s in self.history
            if s.seq > action.model_seq and s.kind == StepKind.TOOL_CALL
        }
        calls = [recorded[p.call.id] for p in action.calls]
        # A call dispatched in the first wave of that many fan-outs without ever getting a
        # result keeps killing its worker: the model sees an error instead.
        given_up = []
        for call in calls:
            tries = sum(1 for f in fan_outs if call.seq in f.payload["calls"][: f.payload["limit"]])
            if tries >= self.config.max_branch_attempts:
                given_up.append(call)
        for index, call in enumerate(given_up):
            outcome = ToolOutcome(
                ok=False,
                error=(
                    f"branch gave up: its worker died {self.config.max_branch_attempts} times "
                    "running this call"
                ),
                attempts=0,
                failure="gave_up",
            )
            self.record_result(
                ToolCall(call.payload["call_id"], call.payload["name"], call.payload["arguments"]),
                outcome,
                started=utcnow(),
                checkpoint=len(given_up) == len(calls) and index == len(given_up) - 1,
            )
        calls = [c for c in calls if c not in given_up]
        if not calls:
            return None
        seqs = [c.seq for c in calls]
        self.append(
            NewStep(
                kind=StepKind.SYSTEM,
                payload={
                    "event": SystemEvent.FAN_OUT,
                    "worker": self.config.worker_id,
                    "owner": self.lease.owner,
                    "token": self.lease.token,
                    "calls": seqs,
                    "call_ids": [c.payload["call_id"] for c in calls],
                    "limit": limit,
                },
                started_at=utcnow(),
            )
        )
        return RunResult(self.session_id, Outcome.FANNED_OUT, branches=tuple(seqs[:limit]))

    def run_tools(self, action: RunTools) -> RunResult | None:
        if self.can_fan_out(action):
            return self.fan_out(action)
        remaining = len(action.calls)
        for pending in action.calls:
            remaining -= 1
            call = pending.call
            tool = self.agent.tools.get(call.name)
            boundary = remaining == 0  # the turn's last result: checkpoint with it
            if tool is not None and tool.needs_approval and pending.decision is None:
                self.append(
                    NewStep(
                        kind=StepKind.SYSTEM,
                        payload={
                            "event": SystemEvent.WAITING_FOR_APPROVAL,
                            "call_id": call.id,
                            "tool": call.name,
                            "arguments": call.arguments,
                            "model_seq": action.model_seq,
                            "requested_at": utcnow().isoformat(),
                        },
                    ),
                    checkpoint=True,
                    status=SessionStatus.WAITING_INPUT,
                    release=True,
                )
                return RunResult(self.session_id, Outcome.WAITING_INPUT)
            if (
                pending.decision is not None
                and pending.decision.get("action") == OperatorAction.REJECT
            ):
                reason = pending.decision.get("reason") or "no reason given"
                actor = pending.decision.get("actor") or "an operator"
                outcome = ToolOutcome(
                    ok=False, error=f"rejected by {actor}: {reason}", attempts=0, failure="rejected"
                )
                self.record_result(call, outcome, started=utcnow(), checkpoint=boundary)
                continue
            resolution = _uncertain_resolution(pending)
            if pending.tool_call_step is not None and tool is not None and not tool.idempotent:
                if resolution is None:
                    # It may or may not have happened, and running it again could do it
                    # twice: a person decides (run again, record what happened, or fail).
                    self.append(
                        NewStep(
                            kind=StepKind.SYSTEM,
                            payload={
                                "event": SystemEvent.UNCERTAIN_CALL,
                                "call_id": call.id,
                                "tool": call.name,
                                "arguments": call.arguments,
                                "tool_call_seq": pending.tool_call_step.seq,
                                "idempotency_key": pending.tool_call_step.idempotency_key,
                            },
                        ),
                        checkpoint=True,
                        status=SessionStatus.WAITING_INPUT,
                        release=True,
                    )
                    return RunResult(self.session_id, Outcome.WAITING_INPUT)
                if resolution.get("action") == OperatorAction.RECORD_RESULT:
                    outcome = ToolOutcome(ok=True, output=resolution.get("output"), attempts=0)
                    self.record_result(
                        call,
                        outcome,
                        started=utcnow(),
                        checkpoint=boundary,
                        recorded_by=resolution.get("actor") or "an operator",
                    )
                    continue
                # "rerun": a person said it did not happen; run it again with its key.
            if pending.tool_call_step is not None:
                # Recorded before a crash, result never committed: run again, same key.
                key = (
                    pending.tool_call_step.idempotency_key
                    or f"{self.session_id}:{pending.tool_call_step.seq}"
                )
                call_seq = pending.tool_call_step.seq
            else:
                call_seq = self.last_seq + 1
                key = f"{self.session_id}:{call_seq}"
                self.append(
                    NewStep(
                        kind=StepKind.TOOL_CALL,
                        # The key lives in the step's own column: it is derived from the seq,
                        # and payloads stay identical between a resumed and a straight run.
                        payload={
                            "call_id": call.id,
                            "name": call.name,
                            "arguments": call.arguments,
                        },
                        started_at=utcnow(),
                        idempotency_key=key,
                    )
                )
            started = utcnow()
            if tool is None:
                known = ", ".join(t.name for t in self.agent.tools) or "none"
                outcome = ToolOutcome(
                    ok=False,
                    error=f"unknown tool {call.name!r} (available: {known})",
                    failure="tool",
                )
                self.record_result(call, outcome, started=started, checkpoint=boundary)
                continue
            self.run_tool(tool, call, key=key, call_seq=call_seq, boundary=boundary)
        return None

    def run_tool(
        self, tool: Tool, call: ToolCall, *, key: str, call_seq: int, boundary: bool
    ) -> None:
        """Run a recorded call and record its result. Each attempt starts only while the
        run still holds its lease; a non-idempotent call started by a run that then lost
        the session is reported (report_late_call), and the run stops."""
        started = utcnow()
        begun: list[int] = []  # attempts that were allowed to start
        held_back: list[int] = []  # an attempt not started: the lease was gone

        def context(attempt: int) -> ToolContext:
            if self.heartbeat is not None:
                try:
                    self.heartbeat.ensure()
                except LeaseLost:
                    held_back.append(attempt)
                    raise
            begun.append(attempt)
            return ToolContext(
                session_id=self.session_id,
                call_id=call.id,
                seq=call_seq,
                idempotency_key=key,
                attempt=attempt,
                effects=self.effects,
                records=self.records,
                options=self.config.tool_options,
                agent_name=self.agent.name,
                agent_version=self.agent.version,
                agent_state=self.state.agent_state,
                progress=progress_sink(self.store, self.lease),
                fence_token=self.lease.token,
                fence=fence_guard(self.store, self.lease, self.heartbeat),
            )

        ran: ToolOutcome | None = None
        observed = ToolCallRecord(self.record, call.name, call.id)
        try:
            with observe(self.config.telemetry, "tool_call", observed):
                ran = tool.run(context, call.arguments, self.config.transient)
                observed.ok, observed.error, observed.attempts = ran.ok, ran.error, ran.attempts
            self.record_result(call, ran, started=started, checkpoint=boundary)
        except LeaseLost as exc:
            guarded(self.config.telemetry.fenced, self.record, "tool_call")
            if begun and not tool.idempotent:
                # A call started, and the session is someone else's now: whatever it did
                # is not in the trace. Said out loud, never hidden.
                report_late_call(
                    self.store,
                    self.lease,
                    worker=self.config.worker_id,
                    call=call,
                    tool_call_seq=call_seq,
                    idempotency_key=key,
                    refused=ran is None and not held_back,
                    reason=str(exc),
                )
            raise

    def record_result(
        self,
        call: ToolCall,
        outcome: ToolOutcome,
        *,
        started: Any,
        checkpoint: bool,
        recorded_by: str | None = None,
    ) -> None:
        payload = result_payload(call, outcome)
        if recorded_by is not None:
            # Not the tool's word: a person recorded what happened. Marked, and shown to the
            # model as an operator's record.
            payload["recorded_by_operator"] = recorded_by
        self.append(
            NewStep(
                kind=StepKind.TOOL_RESULT, payload=payload, started_at=started, finished_at=utcnow()
            ),
            checkpoint=checkpoint,
        )


def usage_record(usage: Usage, prices: PriceTable, spec: str, model: str) -> dict[str, Any]:
    """A model step's `usage`: its tokens, cache tokens and cost. A call the price table
    has no price for (and whose provider reported none) is marked `unpriced`."""
    provider = spec.partition(":")[0]
    cost = prices.cost(provider, model, usage)
    record: dict[str, Any] = {
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cost": round(cost or 0.0, 8),
    }
    if usage.cache_read_tokens:
        record["cache_read_tokens"] = usage.cache_read_tokens
    if usage.cache_write_tokens:
        record["cache_write_tokens"] = usage.cache_write_tokens
    if cost is None:
        record["unpriced"] = True
    return record


def result_payload(call: ToolCall, outcome: ToolOutcome) -> dict[str, Any]:
    """The tool_result payload of a call's outcome, with the state changes it carries."""
    payload = outcome.payload(call.id, call.name)
    if outcome.plan_update is not None:
        payload["plan_update"] = [
            {"title": title, "status": status} for title, status in outcome.plan_update
        ]
    if outcome.memory_added:
        payload["memory_added"] = list(outcome.memory_added)
    if outcome.batch_cursor is not None:
        payload["batch_cursor"] = dict(outcome.batch_cursor)
    if outcome.ok and outcome.agent_state is not None:
        payload["agent_state"] = outcome.agent_state
    return payload


def fence_guard(store: SessionStore, lease: Lease, heartbeat: Heartbeat | None) -> FenceGuard:
    """What a tool's `ctx.fenced()` enters: the lease checked by this worker's clock (and
    renewed if need be), then the store's own fence (SessionStore.fenced) around the
    tool's writes."""
    fenced = getattr(store, "fenced", None)

    @contextlib.contextmanager
    def guard():
        if heartbeat is not None:
            heartbeat.ensure()
        if fenced is None:
            yield
            return
        with fenced(lease):
            yield

    return guard


def report_late_call(
    store: SessionStore,
    lease: Lease,
    *,
    worker: str,
    call: ToolCall,
    tool_call_seq: int,
    idempotency_key: str,
    refused: bool,
    reason: str,
) -> None:
    """Report a non-idempotent call that a run fenced off had started (the store keeps it
    outside the trace, and the worker's log says it too)."""
    effect = "refused" if refused else "may have happened"
    log.warning(
        "session %s: %s (call %s, seq %s) was started by this run, which then lost the "
        "session (%s); its effect %s",
        lease.session_id,
        call.name,
        call.id,
        tool_call_seq,
        reason,
        "was refused by the fence" if refused else "may have happened: not in the trace",
    )
    report = getattr(store, "report_late_call", None)
    if report is None:
        return
    try:
        report(
            lease,
            {
                "worker": worker,
                "call_id": call.id,
                "tool": call.name,
                "arguments": call.arguments,
                "tool_call_seq": tool_call_seq,
                "idempotency_key": idempotency_key,
                "token": lease.token,
                "effect": effect,
                "reason": reason,
            },
        )
    except Exception:  # the log line above is the report of last resort
        log.exception("session %s: the late call could not be recorded", lease.session_id)


def progress_sink(store: SessionStore, lease: Lease) -> Callable[[int, int | None, str], bool]:
    """Where a tool's `report_progress` goes: the session row, fenced on the run's lease."""

    def report(done: int, total: int | None, message: str) -> bool:
        try:
            return store.report_progress(lease, done=done, total=total, message=message)
        except Exception:  # progress is a courtesy: a failed write must not fail the tool
            log.warning("progress of %s not recorded", lease.session_id, exc_info=True)
            return True

    return report


def run_session(
    session_id: str,
    *,
    store: SessionStore,
    agents: AgentRegistry,
    effects: EffectLedger,
    config: RunConfig,
    make_provider: ProviderFactory = default_make_provider,
    records: RecordSource | None = None,
) -> RunResult:
    """Advance one session as far as it goes: to an answer, a pause, a failure or a cancel."""
    claimed_at = time.monotonic()  # the lease lasts at least the TTL from here
    lease = store.claim(session_id, config.worker_id, config.lease_ttl)
    if lease is None:
        log.info("session %s: not claimed (leased elsewhere or not runnable)", session_id)
        return RunResult(session_id, Outcome.NOT_CLAIMED)
    try:
        head = store.load_tail(session_id)
    except IncompatibleSchemaError as exc:
        store.release(lease)
        return RunResult(session_id, Outcome.INCOMPATIBLE, error=str(exc))
    try:
        agent = agents.get(head.agent_name)
    except UnknownAgent as exc:
        # Not the session's fault: the code that runs it is missing here (removed from
        # RESPAWN_AGENTS, or a worker left on other code). Nothing is written; the session
        # is marked and waits for a worker that has the agent.
        store.release(lease)
        return RunResult(
            session_id,
            Outcome.INCOMPATIBLE,
            error=f"{exc} on this worker (is it in RESPAWN_AGENTS or an installed package?)",
        )
    if lease.crashes >= config.max_crashes:
        message = (
            f"the worker died {lease.crashes} times in a row at step {head.last_seq} without "
            "writing a step; not running it again (a poison session). Fix the cause, then resume."
        )
        store.append(
            lease,
            [
                NewStep(
                    kind=StepKind.ERROR,
                    payload={"where": "worker", "error": message, "crashes": lease.crashes},
                )
            ],
            status=SessionStatus.FAILED,
            error=message,
            release=True,
        )
        return RunResult(session_id, Outcome.FAILED, error=message)
    if agent.runner is not None:
        # A foreign turn loop (agent_runtime.runners): the lease, the run_started step, the
        # heartbeat and the closing status stay the engine's.
        from .runners import run_with_runner

        return run_with_runner(store=store, agent=agent, config=config, lease=lease, head=head)
    try:
        run = _Run(
            store=store,
            agent=agent,
            effects=effects,
            config=config,
            lease=lease,
            head=head,
            make_provider=make_provider,
            records=records,
        )
        refusal = agent.refusal(started=head.agent_version, last_ran=run.state.agent_version)
        if refusal is not None:
            raise AgentStateError(refusal)
        agent_state, upgraders = start_agent_state(agent, run.state)
    except (StateError, AgentStateError) as exc:
        store.release(lease)
        return RunResult(session_id, Outcome.INCOMPATIBLE, error=str(exc))
    interval = config.heartbeat_interval or max(config.lease_ttl / 3, 0.05)
    record = run.record
    if lease.crashes > 0:
        # A takeover of an expired lease: the run before died (or froze) mid-turn.
        record.recovering = True
        record.recovery_seconds = _since_last_step(head)
    with observe(config.telemetry, "run", record):
        try:
            with Heartbeat(store, lease, config.lease_ttl, interval, since=claimed_at) as heartbeat:
                run.heartbeat = heartbeat
                result = run.run(head, agent_state, upgraders)
        except _Stop as stop:
            result = stop.result
        except LeaseLost as exc:
            log.warning("session %s: %s; stopping without writing", session_id, exc)
            guarded(config.telemetry.fenced, record, "append")
            result = RunResult(session_id, Outcome.LEASE_LOST, error=str(exc))
        record.outcome, record.error = result.outcome.value, result.error
    return result


def _since_last_step(head: SessionHead) -> float | None:
    """Seconds from the last durable step of `head` to now (None: no step has a time)."""
    for step in reversed(head.history):
        stamp = step.finished_at or step.started_at
        if stamp is not None:
            return max(0.0, (utcnow() - stamp).total_seconds())
    return None


# --- Fan-out branches -------------------------------------------------------------------


class BranchOutcome(enum.StrEnum):
    RECORDED = "recorded"  # the result is in; other calls of the turn are still running
    JOINED = "joined"  # the turn's last result: checkpointed, the session runs next
    NOT_NEEDED = "not_needed"  # answered already, not of the current turn, or not a branch
    FENCED = "fenced"  # the fan-out was fenced off (a new wave, a rollback, a cancel)
    INCOMPATIBLE = "incompatible"


@dataclass(frozen=True)
class BranchResult:
    session_id: str
    seq: int
    outcome: BranchOutcome
    branches: tuple[int, ...] = ()  # calls of the same turn to enqueue now (the next wave)
    error: str | None = None


def current_fan_out(history: list[StepRecord]) -> tuple[RunTools, StepRecord] | None:
    """The current turn's unanswered calls and its latest `fan_out` step, if it fanned out."""
    action = next_action(history)
    if not isinstance(action, RunTools):
        return None
    for step in reversed(history):
        if step.seq <= action.model_seq:
            return None
        if step.kind == StepKind.SYSTEM and step.payload.get("event") == SystemEvent.FAN_OUT:
            return action, step
    return None


def run_branch(
    session_id: str,
    seq: int,
    *,
    store: SessionStore,
    agents: AgentRegistry,
    effects: EffectLedger,
    config: RunConfig,
    records: RecordSource | None = None,
) -> BranchResult:
    """Run the fan-out branch for the tool call at `seq`, and join the turn if its result
    is the last one.

    A branch writes under the lease of the run that fanned out (owner and token from the
    `fan_out` step), so every write is fenced as the run's own would be, and the session
    still has one writer of its turn sequence: a new run, a rollback or a cancel bumps the
    token and fences late branches off. The result is appended only if the call has none
    yet, decided under the session row's lock (`append_branch_result`); the append that
    finds every call of the fan-out answered is the join, and exactly one append can."""
    try:
        head = store.load_head(session_id)
    except IncompatibleSchemaError as exc:
        return BranchResult(session_id, seq, BranchOutcome.INCOMPATIBLE, error=str(exc))
    found = current_fan_out(head.history)
    if found is None:
        return BranchResult(session_id, seq, BranchOutcome.NOT_NEEDED)
    action, fan = found
    fan_calls: list[int] = list(fan.payload["calls"])
    pending = {p.tool_call_step.seq: p for p in action.calls if p.tool_call_step is not None}
    if seq not in fan_calls or seq not in pending:
        return BranchResult(session_id, seq, BranchOutcome.NOT_NEEDED)
    lease = Lease(session_id, fan.payload["owner"], int(fan.payload["token"]))
    renewed_at = time.monotonic()
    if not store.heartbeat(lease, config.lease_ttl).alive:
        return _refused(store, session_id, seq, pending[seq].call.id)
    try:
        agent = agents.get(head.agent_name)
    except UnknownAgent as exc:
        return BranchResult(session_id, seq, BranchOutcome.NOT_NEEDED, error=str(exc))
    try:
        state = replay(head, agent)
    except StateError as exc:
        return BranchResult(session_id, seq, BranchOutcome.INCOMPATIBLE, error=str(exc))
    refusal = agent.refusal(started=head.agent_version, last_ran=state.agent_version)
    stored = state.agent_state
    if (
        refusal is None
        and agent.state is not None
        and (stored is None or stored["version"] != agent.state.version)
    ):
        # The run that fanned out kept another version of the agent state: its changes
        # could not apply. Left to a run of this code, which upgrades the state first
        # and fans the calls out again once the lease expires.
        refusal = (
            f"agent {agent.name!r}: the fan-out's agent state is at version "
            f"{None if stored is None else stored['version']}, this code's at "
            f"{agent.state.version}"
        )
    if refusal is not None:
        return BranchResult(session_id, seq, BranchOutcome.NOT_NEEDED, error=refusal)
    call = pending[seq].call
    step = pending[seq].tool_call_step
    assert step is not None
    key = step.idempotency_key or f"{session_id}:{seq}"
    tool = agent.tools.get(call.name)
    interval = config.heartbeat_interval or max(config.lease_ttl / 3, 0.05)
    with Heartbeat(store, lease, config.lease_ttl, interval, since=renewed_at) as heartbeat:
        started = utcnow()

        def context(attempt: int) -> ToolContext:
            heartbeat.ensure()  # never start a call after the lease is gone
            return ToolContext(
                session_id=session_id,
                call_id=call.id,
                seq=seq,
                idempotency_key=key,
                attempt=attempt,
                effects=effects,
                options=config.tool_options,
                records=records,
                agent_name=agent.name,
                agent_version=agent.version,
                agent_state=state.agent_state if agent.state is not None else None,
                progress=progress_sink(store, lease),
                fence_token=lease.token,
                fence=fence_guard(store, lease, heartbeat),
            )

        if tool is None:
            outcome = ToolOutcome(ok=False, error=f"unknown tool {call.name!r}", failure="tool")
        else:
            # A branch is its own job, not a run: its call is reported on its own, in the
            # session's trace (sessions_app.telemetry parents it on the session).
            branch = RunRecord(session_id, agent.name, agent.version, config.worker_id)
            observed = ToolCallRecord(branch, call.name, call.id)
            try:
                with observe(config.telemetry, "tool_call", observed):
                    outcome = tool.run(context, call.arguments, config.transient)
                    observed.ok, observed.error = outcome.ok, outcome.error
                    observed.attempts = outcome.attempts
            except LeaseLost:
                guarded(config.telemetry.fenced, branch, "tool_call")
                return _refused(store, session_id, seq, call.id)
        if heartbeat.lost.is_set():
            return _refused(store, session_id, seq, call.id)
        payload = result_payload(call, outcome)
        if step.payload.get("branch"):
            payload["branch"] = step.payload["branch"]
        result = NewStep(
            kind=StepKind.TOOL_RESULT,
            payload=config.redactor.redact(payload),
            started_at=started,
            finished_at=utcnow(),
        )
        try:
            appended = store.append_branch_result(
                lease, result, call_id=call.id, after_seq=action.model_seq
            )
        except LeaseLost:
            return _refused(store, session_id, seq, call.id)
        if appended.seq is None:
            return BranchResult(session_id, seq, BranchOutcome.NOT_NEEDED)
        if appended.unanswered:
            # The next wave: the result just written frees one slot of the agent's limit.
            # Each append gets a distinct count (the row lock orders them), so each waiting
            # call is enqueued by exactly one branch.
            limit = int(fan.payload.get("limit") or len(fan_calls))
            answered = len(fan_calls) - appended.unanswered
            index = limit + answered - 1
            more = (fan_calls[index],) if index < len(fan_calls) else ()
            return BranchResult(session_id, seq, BranchOutcome.RECORDED, branches=more)
        return _join(session_id, seq, store=store, agent=agent, lease=lease, fan=fan)


def _refused(store: SessionStore, session_id: str, seq: int, call_id: str) -> BranchResult:
    """The outcome of a branch whose lease check failed. The join releases the fan-out's
    lease once every call is answered, so a duplicate of a branch (its job run twice) that
    checks after the join finds the lease gone without being fenced off: its call was
    answered by the other copy, and it was not needed. Fenced means the call has no
    result: a new wave, a rollback or a cancel took the session away."""
    history = store.load_head(session_id).history
    answered = any(
        s.kind == StepKind.TOOL_RESULT and s.payload.get("call_id") == call_id for s in history
    )
    outcome = BranchOutcome.NOT_NEEDED if answered else BranchOutcome.FENCED
    return BranchResult(session_id, seq, outcome)


def _join(
    session_id: str,
    seq: int,
    *,
    store: SessionStore,
    agent: Agent,
    lease: Lease,
    fan: StepRecord,
) -> BranchResult:
    """Checkpoint the joined turn and give the lease back: the session's next run (the job
    enqueues it) calls the model with every result in."""
    head = store.load_head(session_id)
    state = replay(head, agent)
    joined = NewStep(
        kind=StepKind.SYSTEM,
        payload={
            "event": SystemEvent.JOINED,
            "fan_out_seq": fan.seq,
            "results": len(fan.payload["calls"]),
        },
        started_at=utcnow(),
    )
    apply_step(state, StepRecord(seq=head.last_seq + 1, kind=joined.kind, payload=joined.payload))
    try:
        store.append(lease, [joined], checkpoint=NewCheckpoint(state=state), release=True)
    except LeaseLost:
        return BranchResult(session_id, seq, BranchOutcome.FENCED)
    return BranchResult(session_id, seq, BranchOutcome.JOINED)
