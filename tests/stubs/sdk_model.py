"""A Chat Completions stub that answers from what it is sent, for the OpenAI Agents SDK
agent of tests/packages/acme_sdk: the same conversation gets the same answer however often
a crash makes the SDK ask again.

The last user message decides:
  "loop N"            call `work` (step 1, 2, ...) until N results came back, then
                      answer "Worked N steps."
  "refund ORDER N"    call `refund` once; answer with what the tool returned
  "refunds A N B M"   call `refund` twice in one turn; answer with both results
  anything else       "You said: TEXT (turn K, saw M messages)", K counting user messages
A request with "stream": true gets the same answer as server-sent chunks.
"""

from __future__ import annotations

import json
import re

import pytest

from .llm_servers import (
    OPENAI_PATH,
    Recorded,
    Reply,
    StubServer,
    isolate_sdk_environment,
    openai_reply,
)


def _texts(content) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


def support_model(recorded: Recorded) -> Reply:
    reply = _answer(recorded.json["messages"])
    return _as_stream(reply) if recorded.json.get("stream") else reply


def _as_stream(reply: Reply) -> Reply:
    """The same answer as Chat Completions' server-sent chunks (a streamed run)."""
    body = reply.body
    message = body["choices"][0]["message"]
    base = {k: body[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    delta: dict = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
    chunks = [
        {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
        {
            **base,
            "choices": [
                {"index": 0, "delta": {}, "finish_reason": body["choices"][0]["finish_reason"]}
            ],
        },
        {**base, "choices": [], "usage": body.get("usage")},
    ]
    text = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
    return Reply(body=text, content_type="text/event-stream")


def _answer(messages: list[dict]) -> Reply:
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    last = users[-1] if users else 0
    request = _texts(messages[last]["content"]) if users else ""
    after = messages[last + 1 :]
    results = [m for m in after if m["role"] == "tool"]
    call_id = f"call-{len(messages)}"
    if match := re.fullmatch(r"loop (\d+)", request):
        wanted = int(match[1])
        if len(results) < wanted:
            return openai_reply(None, ((call_id, "work", {"step": len(results) + 1}),))
        return openai_reply(f"Worked {wanted} steps.")
    if match := re.fullmatch(r"refund (\S+) (\d+)", request):
        if not results:
            return openai_reply(
                None, ((call_id, "refund", {"order": match[1], "amount": int(match[2])}),)
            )
        return openai_reply(f"Refund result: {_texts(results[-1]['content'])}")
    if match := re.fullmatch(r"refunds (\S+) (\d+) (\S+) (\d+)", request):
        if not results:
            return openai_reply(
                None,
                (
                    (f"{call_id}-a", "refund", {"order": match[1], "amount": int(match[2])}),
                    (f"{call_id}-b", "refund", {"order": match[3], "amount": int(match[4])}),
                ),
            )
        return openai_reply("Refunds: " + "; ".join(_texts(r["content"]) for r in results))
    return openai_reply(f"You said: {request} (turn {len(users)}, saw {len(messages)} messages)")


@pytest.fixture
def sdk_model(monkeypatch):
    """The stub, started; ACME_SDK_BASE_URL points the acme_sdk agent (and workers started
    after it, which inherit the environment) at it."""
    isolate_sdk_environment(monkeypatch)
    with StubServer(OPENAI_PATH, respond=support_model) as server:
        monkeypatch.setenv("ACME_SDK_BASE_URL", server.url + "/v1")
        yield server


def sent_messages(server: StubServer, index: int = -1) -> list[dict]:
    """The messages of one request the stub received (the last by default)."""
    return json.loads(server.requests[index].raw)["messages"]
