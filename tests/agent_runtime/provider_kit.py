"""What the provider tests share: an agent with the demo calculator, a runner that goes
through the provider registry (as a worker does), and the check that a key leaked nowhere."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from agent_runtime.agents import AgentDefinition, AgentRegistry, calculator
from agent_runtime.loop import RunResult
from agent_runtime.store import InMemoryStore
from agent_runtime.tools import ToolRegistry

from .helpers import run

# Recognisable, so a leak shows up in any assertion message.
KEY = "sk-test-SECRET-abc123"
SYSTEM_PROMPT = "You are a careful calculator. Use the tool."


def calculator_agents(model: str) -> AgentRegistry:
    return AgentRegistry(
        [
            AgentDefinition(
                name="calc",
                version="1",
                description="Calculates with the calculator tool.",
                model=model,
                system_prompt=SYSTEM_PROMPT,
                tools=ToolRegistry([calculator]),
                max_steps=20,
            )
        ]
    )


def run_agent(
    store: Any,
    session_id: str,
    model: str,
    options: dict[str, Any],
    worker: str = "w1",
    **config: Any,
) -> RunResult:
    """Run the calculator agent with real provider construction (the registry, lazily)."""
    return run(
        store,
        session_id,
        agents=calculator_agents(model),
        worker=worker,
        config={"provider_options": options, "model_timeout": 5.0, **config},
    )


def assert_secret_nowhere(
    secret: str, store: InMemoryStore, session_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Not in any step, checkpoint or the last error, nor in anything that was logged."""
    session = store.session(session_id)
    assert secret not in repr(session.steps)
    assert secret not in repr(session.checkpoints)
    assert secret not in (session.last_error or "")
    assert secret not in caplog.text
    assert all(secret not in record.getMessage() for record in caplog.records)


def closed_port_url() -> str:
    """A loopback URL where nothing listens: connecting is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"
