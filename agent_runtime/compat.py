"""Would this session run on these agents? The deploy gate's half that is about the
users' code (the other half, loading every blob through the upgraders, is the store's).

A session is stranded by a deploy when its agent is gone, when the new version of the
agent refuses it (`Agent.refusal`), when its agent state cannot be loaded (a version with
no upgrader, or newer than the code), or when a tool call it still has to run — pending,
waiting for a person's approval, or uncertain after a crash — names a tool that is gone or
has arguments the tool's new schema no longer accepts. `session_problems` finds each of
these from a loaded session, with the same functions a worker's run uses. An agent whose
turn loop is a foreign runner (a LangGraph graph, an OpenAI Agents SDK agent) is checked
by its runner (`CheckedRunner.session_problems`: a call waiting for approval to a tool
that is gone, an interrupt or next node gone from the graph), since Respawn's loop does
not run its tool calls.
"""

from __future__ import annotations

from .agents import AgentRegistry, AgentStateError, UnknownAgent
from .loop.trace import RunTools, next_action, replay, uncertain_resolution
from .runners import CheckedRunner, Problem
from .state import OperatorAction, StateError
from .store import SessionHead
from .tools import ToolError

# Problems a worker's run refuses the session for (it is marked incompatible); the others
# are tool calls that would fail when they run, which the model then sees.
REFUSALS = frozenset({"agent", "agent version", "agent state"})

__all__ = ["REFUSALS", "Problem", "session_problems"]


def session_problems(head: SessionHead, agents: AgentRegistry) -> list[Problem]:
    """Everything that would stop a worker with these agents from running the session
    (loaded whole, by `load_head`). Empty when it would run."""
    try:
        agent = agents.get(head.agent_name)
    except UnknownAgent:
        known = ", ".join(agents.names()) or "none"
        return [
            Problem(
                "agent",
                f"agent {head.agent_name!r} is not configured in this release (agents: {known})",
            )
        ]
    try:
        state = replay(head, agent)
    except StateError as exc:
        return [Problem("agent state", str(exc))]
    problems = []
    refusal = agent.refusal(started=head.agent_version, last_ran=state.agent_version)
    if refusal is not None:
        problems.append(Problem("agent version", refusal))
    if agent.state is not None:
        try:
            agent.state.load(state.agent_state)
        except AgentStateError as exc:
            problems.append(Problem("agent state", f"agent {agent.name!r}: {exc}"))
    if agent.runner is not None:
        # Respawn's loop runs none of its calls: what it still has to do is the runner's.
        if isinstance(agent.runner, CheckedRunner):
            problems.extend(agent.runner.session_problems(head))
        return problems
    action = next_action(head.history)
    if not isinstance(action, RunTools):
        return problems
    for pending in action.calls:
        decision = pending.decision.action if pending.decision is not None else None
        if decision == OperatorAction.REJECT or (
            decision == OperatorAction.RECORD_RESULT and uncertain_resolution(pending) is not None
        ):
            continue  # decided: the tool does not run
        call = pending.call
        if pending.tool_call_step is not None and call.id in state.uncertain_calls:
            what = "uncertain tool call"
        elif state.pending_approval is not None and state.pending_approval.call_id == call.id:
            what = "tool call waiting for approval"
        else:
            what = "pending tool call"
        seq = pending.tool_call_step.seq if pending.tool_call_step is not None else action.model_seq
        where = f"{what} at seq {seq} ({call.name})"
        tool = agent.tool_registry.get(call.name)
        if tool is None:
            have = ", ".join(agent.tool_registry.names()) or "none"
            problems.append(
                Problem(
                    where,
                    f"agent {agent.name!r} version {agent.version} has no tool "
                    f"{call.name!r} (its tools: {have})",
                )
            )
            continue
        try:
            tool.validate(call.arguments)
        except ToolError as exc:
            problems.append(
                Problem(where, f"the stored arguments no longer fit the tool's schema: {exc}")
            )
    return problems
