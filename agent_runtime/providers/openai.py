"""OpenAI Chat Completions with tool calling, through the official SDK.

Works against OpenAI itself or any OpenAI-compatible server (vLLM, llama.cpp, Ollama):
options["openai_base_url"] points it there, options["openai_api_key"] authenticates.
"""

from __future__ import annotations

import uuid
from typing import Any

import openai

from ..tools import ToolSpec
from ._http import (
    MalformedResponse,
    SdkProvider,
    canonical_json,
    decode_arguments,
    kind,
    object_or_empty,
    response_object,
    snippet,
    token_count,
)
from .base import Message, ModelSettings, ModelTurn, ProviderError, ToolCall, Usage

NAME = "openai"
# Local servers ignore the key, but the SDK refuses to build a client without one.
PLACEHOLDER_KEY = "unused"


class OpenAIProvider(SdkProvider):
    """One Chat Completions request per turn. Retries and backoff belong to the loop."""

    name = NAME
    sdk = openai
    base_error = openai.OpenAIError
    client_class = openai.OpenAI
    default_endpoint = "the OpenAI API"

    def client_key(self, api_key: str) -> str:
        if not api_key and self.base_url is None:
            raise ProviderError(
                "openai: no API key: set OPENAI_API_KEY (or OPENAI_BASE_URL, for a local "
                "OpenAI-compatible server that needs no key)",
                permanent=True,
            )
        return api_key or PLACEHOLDER_KEY

    def resource(self, client: Any) -> Any:
        return client.chat.completions

    def parse(self, body: str) -> ModelTurn:
        return parse_completion(body)

    def request(
        self, messages: list[Message], tools: list[ToolSpec], settings: ModelSettings
    ) -> dict[str, Any]:
        """The Chat Completions request body for one turn."""
        request: dict[str, Any] = {
            "model": settings.model or self.model,
            "messages": chat_messages(messages),
        }
        if tools:  # an empty list is rejected: leave the field out
            request["tools"] = [chat_tool(spec) for spec in tools]
        if settings.temperature is not None:
            request["temperature"] = settings.temperature
        if settings.max_tokens is not None:
            # OpenAI's current models take only max_completion_tokens; compatible servers
            # all know max_tokens, not all know the newer name.
            request["max_tokens" if self.base_url else "max_completion_tokens"] = (
                settings.max_tokens
            )
        return request


def chat_tool(spec: ToolSpec) -> dict[str, Any]:
    function: dict[str, Any] = {"name": spec.name, "parameters": spec.parameters}
    if spec.description:
        function["description"] = spec.description
    return {"type": "function", "function": function}


def chat_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """The conversation as Chat Completions messages."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.role in ("system", "user"):
            out.append({"role": message.role, "content": message.content or ""})
        elif message.role == "assistant":
            entry: dict[str, Any] = {"role": "assistant", "content": message.content}
            if message.tool_calls:
                entry["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {
                            "name": call.name,
                            # Sorted keys: the same bytes whichever store the step came
                            # from (JSONB reorders keys). Arguments that were not valid
                            # JSON go back wrapped, as valid JSON: some compatible servers
                            # parse them to render their chat template, and would refuse.
                            "arguments": canonical_json(call.arguments),
                        },
                    }
                    for call in message.tool_calls
                ]
            elif message.content is None:
                entry["content"] = ""  # an assistant message needs content or tool calls
            out.append(entry)
        elif message.role == "tool":
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": message.tool_call_id or "",
                    "content": message.content or "",
                }
            )
        else:
            raise ProviderError(f"openai: cannot send a {message.role!r} message", permanent=True)
    return out


def parse_completion(text: str) -> ModelTurn:
    """The turn in a Chat Completions response body; MalformedResponse if it has none."""
    data = response_object(text)
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise MalformedResponse(f"no 'choices' in {snippet(text)}")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise MalformedResponse("choices[0].message is missing or not an object")
    content = message.get("content")
    if content is None and isinstance(message.get("refusal"), str):
        content = message["refusal"]  # a refusal is the model's answer for this turn
    if content is not None and not isinstance(content, str):
        raise MalformedResponse(
            f"choices[0].message.content must be a string or null, got {kind(content)}"
        )
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise MalformedResponse(
            f"choices[0].message.tool_calls must be an array, got {kind(raw_calls)}"
        )
    calls: list[ToolCall] = []
    for index, raw in enumerate(raw_calls):
        calls.append(_tool_call(index, raw, taken={c.id for c in calls}))
    if content is None and not calls:
        raise MalformedResponse("choices[0].message has neither content nor tool calls")
    usage = object_or_empty(data.get("usage"))
    details = object_or_empty(usage.get("prompt_tokens_details"))
    return ModelTurn(
        text=content,
        tool_calls=calls,
        usage=Usage(
            # prompt_tokens includes the cached ones (OpenAI caches without a write fee).
            input_tokens=token_count(usage.get("prompt_tokens")),
            output_tokens=token_count(usage.get("completion_tokens")),
            cache_read_tokens=token_count(details.get("cached_tokens")),
        ),
    )


def _tool_call(index: int, raw: object, taken: set[str]) -> ToolCall:
    where = f"choices[0].message.tool_calls[{index}]"
    function = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(function, dict):
        raise MalformedResponse(f"{where}.function is missing or not an object")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise MalformedResponse(f"{where}.function.name is missing")
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        decoded = decode_arguments(arguments)
    elif isinstance(arguments, dict):
        decoded = arguments  # a few compatible servers send an object instead of its text
    elif arguments is None:
        decoded = {}
    else:
        raise MalformedResponse(
            f"{where}.function.arguments must be a JSON string, got {kind(arguments)}"
        )
    call_id = raw.get("id") if isinstance(raw, dict) else None
    if not isinstance(call_id, str) or not call_id or call_id in taken:
        # Some compatible servers leave ids out or repeat them, but the loop pairs each
        # result with its call by id. Stored in the model step, a made-up id is as durable
        # as a real one.
        call_id = f"call_{uuid.uuid4().hex[:24]}"
    return ToolCall(id=call_id, name=name, arguments=decoded)
