"""A team's own agents, outside Respawn: what the tests register through RESPAWN_AGENTS
(`acme_agents:agents_v1`, ...) and through the `respawn.agents` entry point. It uses only
the public API (`agent_runtime`), keeps state of its own, and comes in the versions a
team would ship over time:

- v1: tickets as a list of titles (agent state version 1);
- v2: tickets as {title, status} (agent state version 2, with the upgrader from 1);
- renamed: v3 renames the `refund` tool to `issue_refund` (what the deploy gate must
  catch for a session waiting for approval of a refund);
- strict: v3 whose `refund` takes the amount as a string of cents (stored arguments no
  longer validate);
- no_upgrader: agent state version 3 with an upgrader from 2 only;
- incompatible: v4 declaring that sessions started before version 4 cannot continue.

ACME_WORK_DELAY (seconds, default 0) is how long each `work` call takes.
"""

from __future__ import annotations

import logging
import os
import re
import time
from typing import Any

from agent_runtime import (
    Agent,
    AgentState,
    Limits,
    Message,
    ModelTurn,
    SessionState,
    ToolContext,
    ToolError,
    scripted_model,
    tool,
)
from agent_runtime.providers.scripted import (
    position,
    tool_call,
    tool_results,
)

log = logging.getLogger("acme_agents")

# --- the scripted model (a real deployment names an OpenAI or Anthropic model) ---------


@scripted_model("acme")
def acme_model(messages: list[Message]) -> ModelTurn:
    """'open ticket <title>', 'work <n>', 'refund <order> <cents>'; anything else is
    answered with the instructions it was given (so tests can read them)."""
    request, after, turn, base = position(messages)
    results = tool_results(after)
    if match := re.match(r"open ticket (?P<title>.+)", request):
        if turn == 0:
            return ModelTurn(
                text="Opening it.",
                tool_calls=[tool_call(base, 0, "open_ticket", title=match["title"])],
            )
        result = results[-1]
        if not result.get("ok"):
            return ModelTurn(text=f"Could not open it: {result.get('error')}")
        return ModelTurn(text=f"Opened {match['title']}; {result['output']['open']} open.")
    if match := re.match(r"work (?P<n>\d+)", request):
        n = int(match["n"])
        if turn < n:
            return ModelTurn(
                text=f"Step {turn + 1}.", tool_calls=[tool_call(base, 0, "work", step=turn + 1)]
            )
        return ModelTurn(text=f"Worked {n} steps.")
    if match := re.match(r"refund (?P<order>\S+) (?P<cents>\d+)", request):
        if turn == 0:
            return ModelTurn(
                text="Asking for approval.",
                tool_calls=[
                    tool_call(
                        base, 0, "refund", order=match["order"], amount_cents=int(match["cents"])
                    )
                ],
            )
        result = results[-1]
        if result.get("ok"):
            return ModelTurn(text=f"Refunded: {result['output']['reference']}.")
        return ModelTurn(text=f"Not refunded: {result.get('error')}")
    system = messages[0].content if messages and messages[0].role == "system" else ""
    return ModelTurn(text=f"Instructions: {system}")


# --- tools ---------------------------------------------------------------------------


@tool(name="open_ticket")
def open_ticket_v1(ctx: ToolContext, title: str) -> dict[str, Any]:
    """Open a support ticket."""
    # The team's own logger, as agents log: what it writes is the deployment's log too.
    log.warning("opening ticket %r", title)
    ctx.state["tickets"].append(title)
    return {"open": len(ctx.state["tickets"])}


@tool(name="open_ticket")
def open_ticket_v2(ctx: ToolContext, title: str) -> dict[str, Any]:
    """Open a support ticket."""
    ctx.state["tickets"].append({"title": title, "status": "open"})
    return {"open": sum(1 for t in ctx.state["tickets"] if t["status"] == "open")}


@tool(timeout=120)
def work(ctx: ToolContext, step: int) -> dict[str, Any]:
    """One step of slow work with a side effect, keyed for idempotency."""
    ctx.report_progress(0, 1, f"step {step}")
    time.sleep(float(os.environ.get("ACME_WORK_DELAY", "0")))
    ctx.effects.record(
        ctx.idempotency_key, session_id=ctx.session_id, tool="work", payload={"step": step}
    )
    ctx.report_progress(1, 1, f"step {step} done")
    return {"step": step}


@tool(needs_approval=True, idempotent=False)
def refund(ctx: ToolContext, order: str, amount_cents: int) -> dict[str, Any]:
    """Refund an order; a person approves each one."""
    if amount_cents <= 0:
        raise ToolError("amount_cents must be positive")
    return {"reference": f"rf-{order}-{amount_cents}"}


@tool(name="issue_refund", needs_approval=True, idempotent=False)
def issue_refund(ctx: ToolContext, order: str, amount_cents: int) -> dict[str, Any]:
    """Refund an order; a person approves each one."""
    return {"reference": f"rf-{order}-{amount_cents}"}


@tool(name="refund", needs_approval=True, idempotent=False)
def refund_strict(ctx: ToolContext, order: str, amount: str) -> dict[str, Any]:
    """Refund an order (amount: cents as a string); a person approves each one."""
    return {"reference": f"rf-{order}-{amount}"}


# --- agent state and instructions ----------------------------------------------------


def tickets_v1_to_v2(old: dict[str, Any]) -> dict[str, Any]:
    return {"tickets": [{"title": t, "status": "open"} for t in old["tickets"]]}


def instructions(state: SessionState) -> str:
    return f"You handle ACME support tickets. {len(state.agent_data.get('tickets', []))} on file."


def _agent(version: str, tools: list, state: AgentState, **extra: Any) -> Agent:
    return Agent(
        name="acme",
        version=version,
        model="scripted:acme",
        description="ACME support: opens tickets, works through jobs, refunds with approval.",
        instructions=instructions,
        tools=tools,
        limits=Limits(max_steps=100),
        state=state,
        **extra,
    )


STATE_V1 = AgentState(version=1, initial=lambda: {"tickets": []})
STATE_V2 = AgentState(version=2, initial=lambda: {"tickets": []}, upgraders={1: tickets_v1_to_v2})


def agents_v1() -> list[Agent]:
    return [_agent("1", [open_ticket_v1, work, refund], STATE_V1)]


def agents_v2() -> list[Agent]:
    return [_agent("2", [open_ticket_v2, work, refund], STATE_V2)]


def agents_renamed() -> list[Agent]:
    return [_agent("3", [open_ticket_v2, work, issue_refund], STATE_V2)]


def agents_strict() -> list[Agent]:
    return [_agent("3", [open_ticket_v2, work, refund_strict], STATE_V2)]


def agents_no_upgrader() -> list[Agent]:
    state = AgentState(version=3, initial=lambda: {"tickets": []}, upgraders={2: lambda d: d})
    return [_agent("3", [open_ticket_v2, work, refund], state)]


def agents_incompatible() -> list[Agent]:
    return [_agent("4", [open_ticket_v2, work, refund], STATE_V2, compatible_since="4")]


# What the package's entry point names: one agent of another name, so a test can tell
# where it came from.
entry_agent = Agent(
    name="acme-ep",
    version="1",
    model="scripted:acme",
    instructions="Installed through an entry point.",
    tools=[work],
)
