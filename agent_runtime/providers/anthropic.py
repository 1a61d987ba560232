"""Anthropic's Messages API with tool use, through the official SDK.

options["anthropic_api_key"] authenticates; options["anthropic_base_url"] (optional, empty:
the SDK's default) points the client at a gateway or a test server.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic

from ..tools import ToolSpec
from ._http import (
    MalformedResponse,
    SdkProvider,
    canonical,
    kind,
    object_or_empty,
    response_object,
    server_detail,
    snippet,
    token_count,
)
from .base import Message, ModelSettings, ModelTurn, ProviderError, ToolCall, Usage

NAME = "anthropic"
# The API requires max_tokens on every request; enough for a long answer or several calls.
DEFAULT_MAX_TOKENS = 4096


class AnthropicProvider(SdkProvider):
    """One Messages request per turn. Retries and backoff belong to the loop."""

    name = NAME
    sdk = anthropic
    base_error = anthropic.AnthropicError
    client_class = anthropic.Anthropic
    default_endpoint = "the Anthropic API"

    def client_key(self, api_key: str) -> str:
        if not api_key:
            raise ProviderError("anthropic: no API key: set ANTHROPIC_API_KEY", permanent=True)
        return api_key

    def resource(self, client: Any) -> Any:
        return client.messages

    def parse(self, body: str) -> ModelTurn:
        return parse_message(body)

    def request(
        self, messages: list[Message], tools: list[ToolSpec], settings: ModelSettings
    ) -> dict[str, Any]:
        """The Messages request body for one turn."""
        request: dict[str, Any] = {
            "model": settings.model or self.model,
            "max_tokens": settings.max_tokens or DEFAULT_MAX_TOKENS,
            "messages": conversation(messages),
        }
        system = "\n\n".join(m.content for m in messages if m.role == "system" and m.content)
        if system:
            request["system"] = system  # the system prompt is a parameter, not a message
        if tools:
            request["tools"] = [tool_definition(spec) for spec in tools]
        # settings.temperature is not sent: the Messages API version this SDK speaks has no
        # sampling temperature (the SDK refuses the argument).
        return request


def tool_definition(spec: ToolSpec) -> dict[str, Any]:
    definition: dict[str, Any] = {"name": spec.name, "input_schema": spec.parameters}
    if spec.description:
        definition["description"] = spec.description
    return definition


def conversation(messages: list[Message]) -> list[dict[str, Any]]:
    """The conversation as Messages API turns.

    Roles must alternate and every tool_use needs its tool_result in the very next user
    turn, so consecutive tool results (and any user text next to them) share one user
    turn, with the tool_result blocks first, as the API requires.
    """
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            continue
        role, blocks = _blocks(message)
        if not blocks:
            continue  # an empty block is refused; an empty turn carries nothing anyway
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    for turn in turns:
        if turn["role"] == "user":
            turn["content"].sort(key=lambda block: block["type"] != "tool_result")  # stable
    return turns


def _blocks(message: Message) -> tuple[str, list[dict[str, Any]]]:
    if message.role == "user":
        return "user", [{"type": "text", "text": message.content}] if message.content else []
    if message.role == "assistant":
        blocks: list[dict[str, Any]] = []
        if message.content:
            blocks.append({"type": "text", "text": message.content})
        for call in message.tool_calls:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": call.id,
                    "name": call.name,
                    # Sorted keys: the same bytes whichever store the step came from.
                    "input": canonical(call.arguments),
                }
            )
        return "assistant", blocks
    if message.role == "tool":
        result: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": message.tool_call_id or "",
            "content": message.content or "",
        }
        if _failed(message.content):
            result["is_error"] = True  # lets the model tell a failed tool from an answer
        return "user", [result]
    raise ProviderError(f"anthropic: cannot send a {message.role!r} message", permanent=True)


def _failed(content: str | None) -> bool:
    """Whether a tool message (the loop's JSON result) reports a failure."""
    try:
        result = json.loads(content or "")
    except ValueError:
        return False
    return isinstance(result, dict) and result.get("ok") is False


def parse_message(text: str) -> ModelTurn:
    """The turn in a Messages response body; MalformedResponse if it has none."""
    data = response_object(text)
    if data.get("type") == "error":
        raise MalformedResponse(f"an error in a success response: {server_detail(data)}")
    content = data.get("content")
    if not isinstance(content, list):
        raise MalformedResponse(f"no 'content' array in {snippet(text)}")
    texts: list[str] = []
    calls: list[ToolCall] = []
    for index, block in enumerate(content):
        where = f"content[{index}]"
        if not isinstance(block, dict):
            raise MalformedResponse(f"{where} must be an object, got {kind(block)}")
        if block.get("type") == "text":
            if not isinstance(block.get("text"), str):
                raise MalformedResponse(f"{where}.text must be a string")
            texts.append(block["text"])
        elif block.get("type") == "tool_use":
            call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
            if not isinstance(call_id, str) or not call_id:
                raise MalformedResponse(f"{where}.id is missing")
            if not isinstance(name, str) or not name:
                raise MalformedResponse(f"{where}.name is missing")
            if not isinstance(arguments, dict):
                raise MalformedResponse(f"{where}.input must be an object, got {kind(arguments)}")
            calls.append(ToolCall(id=call_id, name=name, arguments=arguments))
        # Other block types (thinking, server tools) belong to features this provider does
        # not request.
    usage = object_or_empty(data.get("usage"))
    return ModelTurn(
        text="".join(texts) if texts else None,
        tool_calls=calls,
        usage=Usage(
            # input_tokens counts only what was not read from or written to the prompt
            # cache; all of it was sent, and budgets count what was sent.
            input_tokens=token_count(usage.get("input_tokens"))
            + token_count(usage.get("cache_creation_input_tokens"))
            + token_count(usage.get("cache_read_input_tokens")),
            output_tokens=token_count(usage.get("output_tokens")),
            cache_read_tokens=token_count(usage.get("cache_read_input_tokens")),
            cache_write_tokens=token_count(usage.get("cache_creation_input_tokens")),
        ),
    )
