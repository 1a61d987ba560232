"""An OpenAI Agents SDK program whose conversations live in Respawn.

    OPENAI_API_KEY=... python examples/openai_agents_chat.py ticket-42 "Where is order O-7?"

Each call continues conversation `ticket-42` (a session in the dashboard). A refund needs
a person's approval: the run is stored and waits; approve it on the session page (or with
`POST /api/sessions/{id}/approve`) and a worker whose RESPAWN_AGENTS has
`openai_agents_chat:agents` (with examples/ on PYTHONPATH) finishes the run.
The model is OpenAI's, or any server speaking its Chat Completions protocol at
OPENAI_BASE_URL; RESPAWN_MODEL names it.
"""

from __future__ import annotations

import asyncio
import os
import sys

from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool
from openai import AsyncOpenAI

from sessions_app.openai_agents.session import RespawnSession, openai_agent


@function_tool(needs_approval=True)
def refund(order: str, amount: int) -> str:
    """Refund an order (a person approves it first)."""
    return f"refunded {amount} on {order}"


support = Agent(
    name="support",
    instructions="You help customers with their orders.",
    tools=[refund],
    model=OpenAIChatCompletionsModel(
        model=os.environ.get("RESPAWN_MODEL", "gpt-4o-mini"), openai_client=AsyncOpenAI()
    ),
)

# For the workers: RESPAWN_AGENTS=openai_agents_chat:agents
agents = [openai_agent("support-sdk", support, version="1")]


async def main(conversation: str, text: str) -> None:
    session = RespawnSession(conversation, agent="support-sdk")
    try:
        # Traces stay on this machine (the SDK would otherwise send them to its vendor).
        untraced = RunConfig(tracing_disabled=True)
        result = await Runner.run(support, text, session=session, run_config=untraced)
        if result.interruptions:
            for call in await session.wait_for_approval(result):
                print(f"waiting for approval: {call['tool']} {call['arguments']}")
            print(f"session {session.respawn_id}")
        else:
            print(result.final_output)
    finally:
        session.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
