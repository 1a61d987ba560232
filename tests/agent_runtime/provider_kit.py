"""What the provider tests share: an agent with the demo calculator, a runner that goes
through the provider registry (as a worker does), the check that a key leaked nowhere, and
a kit per provider (its stub server, options, replies and errors) for the tests every
provider must pass, which take the `kit` fixture."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from agent_runtime.agents import Agent, AgentRegistry, Limits
from agent_runtime.loop import RunResult
from agent_runtime.providers import Message, ModelSettings, Provider
from agent_runtime.providers.anthropic import AnthropicProvider
from agent_runtime.providers.openai import OpenAIProvider
from agent_runtime.state import StepKind
from agent_runtime.store import InMemoryStore
from demo_agents import calculator

from ..stubs.llm_servers import (
    Recorded,
    Reply,
    StubServer,
    anthropic_error,
    anthropic_reply,
    openai_error,
    openai_reply,
)
from .helpers import run

# The smallest conversation a provider is asked to answer.
HELLO = [Message("system", "Be brief."), Message("user", "hi")]


def model_steps(store: InMemoryStore, session_id: str) -> list[Any]:
    """The session's model steps, in order."""
    return [s for s in store.session(session_id).steps if s.kind == StepKind.MODEL]


# Recognisable, so a leak shows up in any assertion message.
KEY = "sk-test-SECRET-abc123"
SYSTEM_PROMPT = "You are a careful calculator. Use the tool."


def calculator_agents(model: str) -> AgentRegistry:
    return AgentRegistry(
        [
            Agent(
                name="calc",
                version="1",
                description="Calculates with the calculator tool.",
                model=model,
                instructions=SYSTEM_PROMPT,
                tools=[calculator],
                limits=Limits(max_steps=20),
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


# --- One kit per provider, for the tests they all must pass -----------------------------


class ProviderKit:
    """A provider as the shared tests drive it, against its own stub server. Subclasses
    add options(base_url), provider(options), reply(text, calls), error(status, message),
    rate_limited() and sent_key(request), each in their vendor's protocol."""

    name: str  # the prefix of its error messages
    server_fixture: str
    model: str  # as an agent names it
    settings: ModelSettings
    key_setting: str  # what its missing-key error names
    without_key: dict[str, str]  # options with no credential
    # What the server says to a bad key, and the end of the error the session records.
    unauthorized: tuple[str, str]

    def __init__(self, server: StubServer) -> None:
        self.server = server


class OpenAIKit(ProviderKit):
    name = "openai"
    server_fixture = "openai_server"
    model = "openai:gpt-4o-mini"
    settings = ModelSettings(model="gpt-4o-mini", timeout=5.0)
    key_setting = "OPENAI_API_KEY"
    without_key = {"openai_api_key": "", "openai_base_url": ""}
    unauthorized = (
        f"Incorrect API key provided: {KEY}. Check your key.",
        "openai: 401 Unauthorized: Incorrect API key provided: [redacted]. Check your key.",
    )

    def options(self, base_url: str | None = None) -> dict[str, Any]:
        return {"openai_base_url": f"{base_url or self.server.url}/v1", "openai_api_key": KEY}

    def provider(self, options: dict[str, Any] | None = None) -> Provider:
        return OpenAIProvider(model="gpt-4o-mini", options=options or self.options())

    def reply(self, text: str | None, calls: tuple = (), **extra: Any) -> Reply:
        return openai_reply(text, calls, **extra)

    def error(self, status: int, message: str) -> Reply:
        return openai_error(status, message)

    def rate_limited(self) -> Reply:
        return openai_error(429, "Rate limit reached for gpt-4o-mini", "requests")

    @staticmethod
    def sent_key(request: Recorded) -> str:
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        return key if scheme == "Bearer" else ""


class AnthropicKit(ProviderKit):
    name = "anthropic"
    server_fixture = "anthropic_server"
    model = "anthropic:claude-sonnet-4-5"
    settings = ModelSettings(model="claude-sonnet-4-5", timeout=5.0)
    key_setting = "ANTHROPIC_API_KEY"
    without_key = {"anthropic_api_key": ""}
    unauthorized = (
        f"invalid x-api-key: {KEY}",
        "anthropic: 401 Unauthorized: invalid x-api-key: [redacted]",
    )
    # The error type the Messages API sends with each status.
    error_types = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        422: "invalid_request_error",
        429: "rate_limit_error",
        529: "overloaded_error",
    }

    def options(self, base_url: str | None = None) -> dict[str, Any]:
        return {"anthropic_base_url": base_url or self.server.url, "anthropic_api_key": KEY}

    def provider(self, options: dict[str, Any] | None = None) -> Provider:
        return AnthropicProvider(model="claude-sonnet-4-5", options=options or self.options())

    def reply(self, text: str | None, calls: tuple = (), **extra: Any) -> Reply:
        return anthropic_reply(text, calls, **extra)

    def error(self, status: int, message: str) -> Reply:
        return anthropic_error(status, message, self.error_types.get(status, "api_error"))

    def rate_limited(self) -> Reply:
        return anthropic_error(
            429, "Number of requests has exceeded your rate limit", "rate_limit_error"
        )

    @staticmethod
    def sent_key(request: Recorded) -> str:
        """The credential as the SDK sent it (x-api-key or a bearer token, by SDK version)."""
        bearer = request.headers.get("authorization", "").removeprefix("Bearer ")
        return request.headers.get("x-api-key") or bearer


KITS: dict[str, type[ProviderKit]] = {"openai": OpenAIKit, "anthropic": AnthropicKit}


@pytest.fixture(params=sorted(KITS))
def kit(request: pytest.FixtureRequest) -> ProviderKit:
    """Each provider in turn, talking to its own stub server; parametrize `kit` indirectly
    with a provider's name for a case of one provider only."""
    kit_class = KITS[request.param]
    return kit_class(request.getfixturevalue(kit_class.server_fixture))
