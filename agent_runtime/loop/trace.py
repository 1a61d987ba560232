"""What a trace means: what the session does next, and the state it adds up to.

What happens next is always derived from the durable trace (`next_action`), never from
in-memory flags, so a run that starts after a crash continues exactly where the last
committed step left off. The state is a fold of the steps over the head checkpoint
(`apply_step`), applied the same way live and on resume. The engine and the dashboard's
previews read the trace through these functions alone.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from ..agents import Agent
from ..providers import ToolCall
from ..state import (
    Budgets,
    OperatorAction,
    OperatorPayload,
    PendingApproval,
    SessionState,
    StepKind,
    StepRecord,
    SystemEvent,
    apply_agent_state_patch,
    apply_budgets,
    as_model,
    as_operator,
    as_system,
    as_tool_result,
    replan,
    step_text,
)
from ..store import SessionHead


@dataclass(frozen=True)
class CallModel:
    pass


@dataclass(frozen=True)
class PendingCall:
    call: ToolCall
    tool_call_step: StepRecord | None  # recorded before a crash: run again with its key
    decision: StepRecord | None  # an operator's word on this call (DECISIONS)


@dataclass(frozen=True)
class RunTools:
    model_seq: int
    calls: list[PendingCall]


@dataclass(frozen=True)
class Finished:
    answer: str | None


Action = CallModel | RunTools | Finished

# Operator steps that give the model something new to respond to (a person's edit): the
# operator steps the model is shown.
NEW_INPUT_ACTIONS = {OperatorAction.INSTRUCTION, OperatorAction.CORRECT_RESULT}
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
    return step.kind == StepKind.USER or step.action in NEW_INPUT_ACTIONS


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
    calls = [ToolCall(**c) for c in as_model(model_step.payload).get("tool_calls") or []]
    if not calls:
        return Finished(step_text(model_step.payload))
    after = history[last_model + 1 :]
    results = {s.call_id for s in after if s.kind == StepKind.TOOL_RESULT}
    recorded = {s.call_id: s for s in after if s.kind == StepKind.TOOL_CALL}
    decisions = {s.call_id: s for s in after if s.action in DECISIONS}
    pending = [
        PendingCall(call=c, tool_call_step=recorded.get(c.id), decision=decisions.get(c.id))
        for c in calls
        if c.id not in results
    ]
    if not pending:
        return CallModel()
    return RunTools(model_seq=model_step.seq, calls=pending)


def uncertain_resolution(pending: PendingCall) -> OperatorPayload | None:
    """A person's rerun/record_result for a call recorded before a crash, made after it."""
    decision = pending.decision
    if (
        decision is None
        or pending.tool_call_step is None
        or decision.action not in UNCERTAIN_RESOLUTIONS
        or decision.seq <= pending.tool_call_step.seq
    ):
        return None
    return as_operator(decision.payload)


def apply_step(state: SessionState, step: StepRecord) -> None:
    """Fold one step into the state (used live and when replaying after a checkpoint)."""
    state.counters.steps += 1
    if step.kind == StepKind.USER:
        state.final_answer = None
    elif step.kind == StepKind.MODEL:
        model = as_model(step.payload)
        state.turn += 1
        state.counters.model_calls += 1
        state.counters.tokens_in += step.tokens_in
        state.counters.tokens_out += step.tokens_out
        state.counters.cost += float((model.get("usage") or {}).get("cost") or 0.0)
        if not model.get("tool_calls"):
            state.final_answer = step_text(step.payload)
    elif step.kind == StepKind.TOOL_RESULT:
        payload = as_tool_result(step.payload)
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
    elif step.action == OperatorAction.SET_BUDGETS:
        apply_budgets(state, step.payload)
    elif step.event == SystemEvent.RUN_STARTED:
        started = as_system(step.payload)
        if started.get("agent_version"):
            state.agent_version = str(started["agent_version"])
        if started.get("agent_state") is not None:
            state.agent_state = copy.deepcopy(started["agent_state"])
    elif step.event == SystemEvent.UNCERTAIN_CALL:
        uncertain = as_system(step.payload)
        if uncertain["call_id"] not in state.uncertain_calls:
            state.uncertain_calls.append(uncertain["call_id"])
    elif step.event == SystemEvent.WAITING_FOR_APPROVAL:
        waiting = as_system(step.payload)
        state.pending_approval = PendingApproval(
            call_id=waiting["call_id"],
            tool=waiting["tool"],
            arguments=waiting["arguments"],
            model_seq=waiting["model_seq"],
            requested_at=waiting.get("requested_at"),
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


def current_fan_out(history: list[StepRecord]) -> tuple[RunTools, StepRecord] | None:
    """The current turn's unanswered calls and its latest `fan_out` step, if it fanned out."""
    action = next_action(history)
    if not isinstance(action, RunTools):
        return None
    for step in reversed(history):
        if step.seq <= action.model_seq:
            return None
        if step.event == SystemEvent.FAN_OUT:
            return action, step
    return None
