"""What an OpenAI Agents SDK agent run by Respawn is, and what a new release of it would
strand: the agents page and the deploy gate read SDK agents as they read Respawn's own.

`describe` gives the model, instructions and tools (with their schemas and whether they
need a person's approval) of the SDK agent an `OpenAIAgentRunner` runs. `session_problems`
names each call a live session still has to run whose tool the agent no longer has: a call
waiting for a person's approval (or approved, not yet run) in the stored RunState, and a
call the trace holds without its output (uncertain after a crash). Resuming such a session
would fail it with the SDK's "Tool ... not found".
"""

from __future__ import annotations

from typing import Any

from agent_runtime.runners import Problem, RunnerDescription, ToolDescription
from agent_runtime.state import OperatorAction, StepKind, as_operator, as_tool_call
from agent_runtime.store import SessionHead

KIND = "OpenAI Agents SDK agent"


def _agents(agent: Any) -> list[Any]:
    """The agent and every agent it can hand off to (a paused run may be in any of them)."""
    seen: dict[int, Any] = {}
    todo = [agent]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen[id(current)] = current
        for handoff in getattr(current, "handoffs", None) or ():
            # A handoff is an Agent, or a Handoff wrapping one (not reachable without a run).
            if hasattr(handoff, "tools"):
                todo.append(handoff)
    return list(seen.values())


def tool_names(agent: Any) -> list[str]:
    """The names of the tools of the agent and of the agents it hands off to."""
    names: list[str] = []
    for each in _agents(agent):
        for tool in getattr(each, "tools", None) or ():
            name = getattr(tool, "name", None)
            if isinstance(name, str) and name not in names:
                names.append(name)
    return names


def _model_name(agent: Any, run_config: Any) -> str:
    for model in (getattr(run_config, "model", None), getattr(agent, "model", None)):
        # The run's model wins over the agent's, as in the SDK's Runner.
        if isinstance(model, str) and model:
            return model
        name = getattr(model, "model", None)
        if isinstance(name, str) and name:
            return name
    return ""


def _instructions(agent: Any) -> str:
    instructions = getattr(agent, "instructions", None)
    if instructions is None:
        return ""
    if isinstance(instructions, str):
        return instructions
    return (
        "computed for each run by "
        f"{getattr(instructions, '__module__', '?')}."
        f"{getattr(instructions, '__qualname__', repr(instructions))}"
    )


def _tool(tool: Any) -> ToolDescription:
    schema = getattr(tool, "params_json_schema", None)
    return ToolDescription(
        name=str(getattr(tool, "name", type(tool).__name__)),
        description=str(getattr(tool, "description", "") or ""),
        parameters=schema if isinstance(schema, dict) else {},
        # A function deciding per call still makes the tool one that may wait for a person.
        needs_approval=bool(getattr(tool, "needs_approval", False)),
    )


def describe(agent: Any, run_config: Any = None) -> RunnerDescription:
    """The SDK agent's model, instructions and tools, as the agents page shows them."""
    return RunnerDescription(
        kind=KIND,
        model=_model_name(agent, run_config),
        instructions=_instructions(agent),
        tools=tuple(_tool(tool) for tool in getattr(agent, "tools", None) or ()),
    )


def session_problems(agent: Any, head: SessionHead, *, state_key: str) -> list[Problem]:
    """Each call the session still has to run whose tool the SDK `agent` does not have. A
    rejected call does not run, and is not one. `state_key`: where the session's checkpoint
    keeps the paused run (its RunState, the calls waiting and the decisions made)."""
    have = tool_names(agent)

    def gone(where: str, tool: str) -> Problem:
        return Problem(
            where,
            f"agent {head.agent_name!r} (SDK agent {getattr(agent, 'name', '?')!r}) has no "
            f"tool {tool!r} (its tools: {', '.join(have) or 'none'})",
        )

    problems: list[Problem] = []
    history = [s for s in head.history if not s.superseded]
    checkpoint = head.checkpoint
    data = checkpoint.state.agent_data.get(state_key) if checkpoint is not None else None
    waiting: set[str] = set()
    if checkpoint is not None and isinstance(data, dict) and data.get("run_state") is not None:
        decided = {
            call_id: (decision or {}).get("action")
            for call_id, decision in (data.get("decided") or {}).items()
        }
        for step in history:
            if step.seq > checkpoint.seq and step.kind == StepKind.OPERATOR:
                word = as_operator(step.payload)
                if word.get("action") in (OperatorAction.APPROVE, OperatorAction.REJECT):
                    decided[str(word.get("call_id"))] = word["action"]
        for call in data.get("pending") or ():
            call_id, tool = str(call.get("call_id")), str(call.get("tool"))
            waiting.add(call_id)
            action = decided.get(call_id)
            if action == OperatorAction.REJECT or tool in have:
                continue
            what = "approved tool call" if action else "tool call waiting for approval"
            problems.append(gone(f"{what} at seq {checkpoint.seq} ({tool})", tool))
    answered = {str(s.payload.get("call_id")) for s in history if s.kind == StepKind.TOOL_RESULT}
    for step in history:
        if step.kind != StepKind.TOOL_CALL:
            continue
        call = as_tool_call(step.payload)
        call_id, tool = str(call.get("call_id")), str(call.get("name"))
        if call_id in answered or call_id in waiting or tool in have:
            continue
        problems.append(gone(f"uncertain tool call at seq {step.seq} ({tool})", tool))
    return problems
