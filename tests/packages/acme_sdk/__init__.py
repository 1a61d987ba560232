"""A team's own OpenAI Agents SDK agent, outside Respawn, registered as an agent with
`sessions_app.openai_agents.session.openai_agent` (RESPAWN_AGENTS=acme_sdk:agents).

Its model is whatever speaks the OpenAI Chat Completions protocol at ACME_SDK_BASE_URL
(read at each model call, so a test's local stub server can change between tests).
`work` and `refund` take ACME_SDK_DELAY seconds (default 0) and record each call in
ACME_SDK_LOG if set; `refund` needs a person's approval.
"""

from __future__ import annotations

import os
import time

from agents import (
    Agent,
    Model,
    ModelProvider,
    OpenAIChatCompletionsModel,
    RunConfig,
    function_tool,
)
from openai import AsyncOpenAI

from sessions_app.openai_agents.session import openai_agent


class EnvModelProvider(ModelProvider):
    """The Chat Completions model at ACME_SDK_BASE_URL, looked up at each run."""

    def get_model(self, model_name: str | None) -> Model:
        client = AsyncOpenAI(
            base_url=os.environ.get("ACME_SDK_BASE_URL", "http://127.0.0.1:9/v1"),
            api_key="stub-key",
            max_retries=0,
        )
        return OpenAIChatCompletionsModel(model=model_name or "acme-model", openai_client=client)


def _log(line: str) -> None:
    path = os.environ.get("ACME_SDK_LOG")
    if path:
        with open(path, "a") as log:
            log.write(line + "\n")


@function_tool
def work(step: int) -> str:
    """Do one step of work."""
    _log(f"work {step} started")
    time.sleep(float(os.environ.get("ACME_SDK_DELAY", "0")))
    _log(f"work {step} done")
    return f"step {step} done"


@function_tool(needs_approval=True)
def refund(order: str, amount: int) -> str:
    """Refund an order (a person approves it first)."""
    _log(f"refund {order} {amount}")
    time.sleep(float(os.environ.get("ACME_SDK_DELAY", "0")))
    return f"refunded {amount} on {order}"


support = Agent(
    name="acme-support",
    instructions="You help Acme's customers.",
    model="acme-model",
    tools=[work, refund],
)

run_config = RunConfig(model_provider=EnvModelProvider())

agents = [
    openai_agent(
        "acme-sdk",
        support,
        version="1",
        description="an SDK agent that works in steps and refunds with approval",
        run_config=run_config,
        max_turns=30,
    )
]

# The next release of the same agent (tests of the version rule).
agents_v2 = [openai_agent("acme-sdk", support, version="2", run_config=run_config, max_turns=30)]

# A release without the refund tool: a refund waiting for approval cannot run on it.
support_without_refund = Agent(
    name="acme-support",
    instructions="You help Acme's customers.",
    model="acme-model",
    tools=[work],
)
agents_without_refund = [
    openai_agent(
        "acme-sdk", support_without_refund, version="2", run_config=run_config, max_turns=30
    )
]

# An agent whose answer is its first tool's output (tool_use_behavior "stop_on_first_tool").
support_tool_answers = support.clone(tool_use_behavior="stop_on_first_tool")
agents_tool_answers = [
    openai_agent("acme-sdk-tool", support_tool_answers, version="1", run_config=run_config)
]
