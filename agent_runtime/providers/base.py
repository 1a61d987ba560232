"""The model provider protocol: messages and tool specs in, one ModelTurn out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from ..tools import ToolSpec


class ProviderError(Exception):
    """A model call failed. permanent=True: retrying cannot help (bad key, bad request)."""

    def __init__(self, message: str, *, permanent: bool = False, status: int | None = None):
        super().__init__(message)
        self.permanent = permanent
        self.status = status


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}


@dataclass(frozen=True)
class Usage:
    """What one model call used. input_tokens counts every input token sent, including
    those read from or written to the provider's prompt cache (cache_read_tokens and
    cache_write_tokens say how many of them were). cost: what the provider itself reported
    (0: none; the price table prices the call, agent_runtime.pricing)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


@dataclass(frozen=True)
class ModelTurn:
    text: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = Usage()


@dataclass(frozen=True)
class Message:
    """One entry of the conversation as providers see it, rebuilt from durable steps."""

    role: str  # system | user | assistant | tool
    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class ModelSettings:
    model: str
    timeout: float = 60.0
    max_tokens: int | None = None
    temperature: float | None = None


class Provider(Protocol):
    def complete(
        self, messages: list[Message], tools: list[ToolSpec], settings: ModelSettings
    ) -> ModelTurn: ...
