"""The `scripted` provider: deterministic, offline models written as Python functions.

A script reads the conversation (as any model would) and decides the next turn from it
alone, so a resumed session gets exactly the turn an uninterrupted one would have got.
Register one under a name, then name it as an agent's model (`scripted:<name>`): for
tests of your own agents, and for demos that need no vendor.

    from agent_runtime import ModelTurn, scripted_model
    from agent_runtime.providers.scripted import episode, tool_call

    @scripted_model("greeter")
    def greeter(messages):
        request, after = episode(messages)
        return ModelTurn(text=f"Hello! You said: {request}")
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..tools import ToolSpec
from .base import Message, ModelSettings, ModelTurn, ProviderError, ToolCall, Usage

Script = Callable[[list[Message]], ModelTurn]

# name -> script; filled by scripted_model (the demo agents register theirs on import).
SCRIPTS: dict[str, Script] = {}


def scripted_model(name: str) -> Callable[[Script], Script]:
    """Register a script as the model `scripted:<name>`."""

    def register(script: Script) -> Script:
        known = SCRIPTS.get(name)
        if (
            known is not None
            and known is not script
            and (
                known.__module__,
                known.__qualname__,
            )
            != (script.__module__, script.__qualname__)
        ):
            raise ValueError(f"a scripted model named {name!r} is registered already")
        SCRIPTS[name] = script
        return script

    return register


def episode(messages: list[Message]) -> tuple[str, list[Message]]:
    """The latest user request and everything the model saw after it."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == "user":
            return messages[index].content or "", messages[index + 1 :]
    return "", []


def tool_results(after: list[Message]) -> list[dict[str, Any]]:
    """The tool results among `after`, as the model sees them ({"name", "ok", "output",
    "error", ...})."""
    results = []
    for message in after:
        if message.role == "tool":
            try:
                results.append(json.loads(message.content or "{}"))
            except json.JSONDecodeError:
                results.append({"ok": False, "error": message.content})
    return results


def turn_number(after: list[Message]) -> int:
    """How many model turns `after` holds (0: the first answer to the request)."""
    return sum(1 for m in after if m.role == "assistant")


def model_turns(messages: list[Message]) -> int:
    """Model turns so far in the whole conversation (to keep call ids unique across
    requests)."""
    return sum(1 for m in messages if m.role == "assistant")


def position(messages: list[Message]) -> tuple[str, list[Message], int, int]:
    """Where a scripted model stands: the latest request, what it saw after it, its turn
    since the request (0: the first answer), and the turns before the request (add the
    turn to number tool calls uniquely across requests: `tool_call(base + turn, ...)`)."""
    request, after = episode(messages)
    turn = turn_number(after)
    return request, after, turn, model_turns(messages) - turn


def tool_call(turn: int, index: int, name: str, **arguments: Any) -> ToolCall:
    """A tool call with an id unique to (turn, index)."""
    return ToolCall(id=f"call_{turn}_{index}", name=name, arguments=arguments)


def _estimate_tokens(text: str | None) -> int:
    return (len(text or "") + 3) // 4


class ScriptedProvider:
    def __init__(self, *, model: str, options: dict[str, Any]) -> None:
        if model not in SCRIPTS:
            known = ", ".join(sorted(SCRIPTS)) or "none registered"
            raise ProviderError(f"no scripted model {model!r} (known: {known})", permanent=True)
        self.script = SCRIPTS[model]

    def complete(
        self, messages: list[Message], tools: list[ToolSpec], settings: ModelSettings
    ) -> ModelTurn:
        turn = self.script(messages)
        offered = {t.name for t in tools}
        for call in turn.tool_calls:
            if call.name not in offered:
                raise ProviderError(f"script called unknown tool {call.name!r}", permanent=True)
        tokens_in = sum(_estimate_tokens(m.content) for m in messages)
        tokens_out = _estimate_tokens(turn.text) + 8 * len(turn.tool_calls)
        return ModelTurn(
            text=turn.text,
            tool_calls=turn.tool_calls,
            usage=Usage(input_tokens=tokens_in, output_tokens=tokens_out),
        )
