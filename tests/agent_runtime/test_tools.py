import time

import pytest

from agent_runtime.store import InMemoryEffects
from agent_runtime.tools import ToolContext, ToolError, ToolRegistry, tool
from demo_agents import calculator


def ctx_factory(key="s:1"):
    return lambda attempt: ToolContext(
        session_id="s",
        call_id="c",
        seq=1,
        idempotency_key=key,
        attempt=attempt,
        effects=InMemoryEffects(),
    )


def test_schema_comes_from_the_signature():
    @tool
    def lookup(ctx: ToolContext, query: str, limit: int = 5) -> dict:
        """Look something up.

        Longer text that the model does not need."""
        return {}

    spec = lookup.spec
    assert spec.name == "lookup"
    assert spec.description == "Look something up."
    assert spec.parameters["properties"] == {
        "query": {"type": "string"},
        "limit": {"type": "integer", "default": 5},
    }
    assert spec.parameters["required"] == ["query"]
    assert spec.parameters["additionalProperties"] is False


def test_invalid_arguments_are_an_error_outcome():
    outcome = calculator.run(ctx_factory(), {"expression": ["not", "a", "string"]})
    assert outcome.ok is False
    assert outcome.error.startswith("invalid arguments for calculator: expression:")
    outcome = calculator.run(ctx_factory(), {"expression": "1+1", "extra": True})
    assert outcome.ok is False and "extra" in outcome.error
    outcome = calculator.run(ctx_factory(), "1+1")
    assert outcome.ok is False and "must be a JSON object" in outcome.error


def test_calculator_refuses_anything_but_arithmetic():
    assert calculator.run(ctx_factory(), {"expression": "(12*7)+3"}).output["value"] == 87
    outcome = calculator.run(ctx_factory(), {"expression": "__import__('os').system('true')"})
    assert outcome.ok is False and "unsupported expression element" in outcome.error
    assert "division by zero" in calculator.run(ctx_factory(), {"expression": "1/0"}).error


def test_tool_timeout_is_an_error_outcome():
    @tool(timeout=0.1)
    def sleepy(ctx: ToolContext) -> dict:
        """Sleeps."""
        time.sleep(1)
        return {}

    started = time.monotonic()
    outcome = sleepy.run(ctx_factory(), {})
    assert time.monotonic() - started < 0.8
    assert outcome.ok is False and outcome.error == "sleepy timed out after 0.1s"


def test_retryable_errors_are_retried_and_counted():
    @tool(retries=2)
    def wobbly(ctx: ToolContext) -> dict:
        """Fails once."""
        if ctx.attempt == 1:
            raise ToolError("try again", retryable=True)
        return {"attempt": ctx.attempt}

    outcome = wobbly.run(ctx_factory(), {})
    assert outcome.ok and outcome.attempts == 2 and outcome.output == {"attempt": 2}


def test_the_errors_of_retried_attempts_are_kept_in_the_result():
    @tool(retries=3)
    def wobbly(ctx: ToolContext) -> dict:
        """Fails twice, differently, then works."""
        if ctx.attempt < 3:
            raise ToolError(f"503 on attempt {ctx.attempt}", retryable=True)
        return {"attempt": ctx.attempt}

    outcome = wobbly.run(ctx_factory(), {})
    assert outcome.attempt_errors == ("503 on attempt 1", "503 on attempt 2")
    payload = outcome.payload("c1", "wobbly")
    assert payload["status"] == "ok" and payload["attempts"] == 3
    assert payload["attempt_errors"] == ["503 on attempt 1", "503 on attempt 2"]

    @tool(retries=1)
    def hopeless(ctx: ToolContext) -> dict:
        """Fails every time."""
        raise ToolError(f"down ({ctx.attempt})", retryable=True)

    failed = hopeless.run(ctx_factory(), {}).payload("c2", "hopeless")
    assert failed["status"] == "error" and failed["error"] == "down (2)"
    assert failed["attempt_errors"] == ["down (1)"]

    @tool
    def steady(ctx: ToolContext) -> dict:
        """Works the first time."""
        return {}

    # A first-time success carries no such key: its payload is as it always was.
    assert "attempt_errors" not in steady.run(ctx_factory(), {}).payload("c3", "steady")


def test_non_retryable_errors_are_not_retried():
    @tool(retries=5)
    def broken(ctx: ToolContext) -> dict:
        """Fails for good."""
        raise ToolError("bad input")

    outcome = broken.run(ctx_factory(), {})
    assert outcome.ok is False and outcome.attempts == 1 and outcome.error == "bad input"


def test_idempotency_key_is_handed_to_the_tool():
    seen = []

    @tool
    def keyed(ctx: ToolContext) -> dict:
        """Records its key."""
        seen.append(ctx.idempotency_key)
        return {}

    keyed.run(ctx_factory("sess:42"), {})
    assert seen == ["sess:42"]


def test_tool_needs_type_hints_and_unique_names():
    with pytest.raises(TypeError, match="needs a type hint"):

        @tool
        def untyped(ctx, x):  # noqa: ANN001
            """No hints."""

    with pytest.raises(ValueError, match="registered twice"):
        ToolRegistry([calculator, calculator])
