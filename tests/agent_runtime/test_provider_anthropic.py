"""The Anthropic provider: the real SDK over HTTP against a local Messages API stub."""

from __future__ import annotations

import json
import logging
import time

import pytest

from agent_runtime.agents import calculator
from agent_runtime.loop import Outcome
from agent_runtime.providers import Message, ModelSettings, ModelTurn, ProviderError, ToolCall
from agent_runtime.providers.anthropic import AnthropicProvider, conversation
from agent_runtime.providers.base import Usage
from agent_runtime.state import SessionStatus, StepKind
from agent_runtime.store import InMemoryStore

from ..stubs.llm_servers import Reply, anthropic_error, anthropic_reply, isolate_sdk_environment
from .helpers import Crash, CrashingStore, new_session
from .provider_kit import (
    KEY,
    SYSTEM_PROMPT,
    assert_secret_nowhere,
    closed_port_url,
    run_agent,
)

MODEL = "anthropic:claude-sonnet-4-5"
SETTINGS = ModelSettings(model="claude-sonnet-4-5", timeout=5.0)
HELLO = [Message("system", "Be brief."), Message("user", "hi")]


def options(server, **extra):
    return {"anthropic_base_url": server.url, "anthropic_api_key": KEY, **extra}


def provider(server, **extra) -> AnthropicProvider:
    return AnthropicProvider(model="claude-sonnet-4-5", options=options(server, **extra))


def sent_key(request) -> str:
    """The credential as the SDK sent it (x-api-key or a bearer token, by SDK version)."""
    bearer = request.headers.get("authorization", "").removeprefix("Bearer ")
    return request.headers.get("x-api-key") or bearer


def model_steps(store, session_id):
    return [s for s in store.session(session_id).steps if s.kind == StepKind.MODEL]


# --- One turn -------------------------------------------------------------------------


def test_plain_text_answer(anthropic_server):
    anthropic_server.script(anthropic_reply("Hello there.", usage=(21, 3)))

    turn = provider(anthropic_server).complete(HELLO, [], SETTINGS)

    assert turn == ModelTurn(text="Hello there.", tool_calls=[], usage=Usage(21, 3))
    (request,) = anthropic_server.requests
    assert request.path == "/v1/messages"
    assert sent_key(request) == KEY
    assert request.headers["anthropic-version"]
    # The system prompt is a parameter; max_tokens is required, so it has a default.
    assert request.json == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 4096,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }


def test_tool_call_turn(anthropic_server):
    anthropic_server.script(
        anthropic_reply(None, (("toolu_1", "calculator", {"expression": "2+2"}),), usage=(40, 9))
    )

    turn = provider(anthropic_server).complete(HELLO, [calculator.spec], SETTINGS)

    assert turn.text is None
    assert turn.tool_calls == [ToolCall("toolu_1", "calculator", {"expression": "2+2"})]
    assert turn.usage == Usage(40, 9)
    assert anthropic_server.requests[0].json["tools"] == [
        {
            "name": "calculator",
            "description": calculator.spec.description,
            "input_schema": calculator.spec.parameters,
        }
    ]


def test_parallel_tool_uses_in_one_turn(anthropic_server):
    anthropic_server.script(
        anthropic_reply(
            "Working on all three.",
            (
                ("toolu_a", "calculator", {"expression": "1+1"}),
                ("toolu_b", "calculator", {"expression": "2*3"}),
                ("toolu_c", "calculator", {"expression": "10/4"}),
            ),
        )
    )

    turn = provider(anthropic_server).complete(HELLO, [calculator.spec], SETTINGS)

    assert turn.text == "Working on all three."
    assert [(c.id, c.arguments["expression"]) for c in turn.tool_calls] == [
        ("toolu_a", "1+1"),
        ("toolu_b", "2*3"),
        ("toolu_c", "10/4"),
    ]


def test_settings_reach_the_request(anthropic_server):
    anthropic_server.script(anthropic_reply("ok"))
    settings = ModelSettings(model="claude-haiku-4-5", timeout=5.0, max_tokens=256, temperature=0)

    provider(anthropic_server).complete(HELLO, [], settings)

    body = anthropic_server.requests[0].json
    assert (body["model"], body["max_tokens"]) == ("claude-haiku-4-5", 256)
    assert "temperature" not in body  # this API version has none


def test_cached_input_counts_as_input(anthropic_server):
    reply = anthropic_reply("ok", usage=(10, 4))
    reply.body["usage"].update(cache_creation_input_tokens=100, cache_read_input_tokens=1000)
    anthropic_server.script(reply)

    turn = provider(anthropic_server).complete(HELLO, [], SETTINGS)

    assert turn.usage == Usage(input_tokens=1110, output_tokens=4)


def test_missing_key_is_a_permanent_error_naming_the_setting():
    with pytest.raises(ProviderError) as info:
        AnthropicProvider(model="claude-sonnet-4-5", options={"anthropic_api_key": ""})
    assert info.value.permanent
    assert "ANTHROPIC_API_KEY" in str(info.value)


def test_consecutive_tool_results_share_one_user_turn_results_first():
    calls = (ToolCall("t1", "calculator", {"expression": "1"}), ToolCall("t2", "x", {}))
    turns = conversation(
        [
            Message("system", "ignored here"),
            Message("user", "go"),
            Message("assistant", None, tool_calls=calls),
            Message("tool", '{"ok": true}', tool_call_id="t1"),
            Message("user", "[Operator instruction] hurry"),
            Message("tool", '{"ok": false}', tool_call_id="t2"),
            Message("assistant", None),  # said nothing: no empty block, no empty turn
            Message("user", "next"),
        ]
    )
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    assert [(b["type"], b.get("tool_use_id") or b.get("text")) for b in turns[2]["content"]] == [
        ("tool_result", "t1"),
        ("tool_result", "t2"),
        ("text", "[Operator instruction] hurry"),
        ("text", "next"),
    ]
    assert "is_error" not in turns[2]["content"][0]
    assert turns[2]["content"][1]["is_error"] is True


# --- Failures -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind", "permanent"),
    [
        (400, "invalid_request_error", True),
        (401, "authentication_error", True),
        (403, "permission_error", True),
        (404, "not_found_error", True),
        (413, "request_too_large", True),
        (422, "invalid_request_error", True),
        (429, "rate_limit_error", False),
        (500, "api_error", False),
        (529, "overloaded_error", False),
    ],
)
def test_http_errors_are_classified(anthropic_server, status, kind, permanent):
    anthropic_server.script(anthropic_error(status, "the server's own words", kind))

    with pytest.raises(ProviderError) as info:
        provider(anthropic_server).complete(HELLO, [], SETTINGS)

    assert (info.value.status, info.value.permanent) == (status, permanent)
    assert str(info.value).startswith(f"anthropic: {status} ")
    assert str(info.value).endswith(": the server's own words")
    assert len(anthropic_server.requests) == 1  # the SDK's own retries are off


def test_rate_limit_then_success_completes_the_session(anthropic_server):
    anthropic_server.script(
        anthropic_error(429, "Number of requests has exceeded your rate limit", "rate_limit_error"),
        anthropic_reply("All good."),
    )
    store = InMemoryStore()
    session_id = new_session(store, "calc", "hello")

    result = run_agent(store, session_id, MODEL, options(anthropic_server))

    assert result.outcome == Outcome.COMPLETED
    assert result.final_answer == "All good."
    assert len(anthropic_server.requests) == 2
    assert anthropic_server.requests[0].raw == anthropic_server.requests[1].raw


def test_unauthorized_fails_the_session_clearly_without_the_key(anthropic_server, caplog):
    caplog.set_level(logging.DEBUG)  # the SDKs' and HTTP clients' debug logs too
    anthropic_server.script(
        anthropic_error(401, f"invalid x-api-key: {KEY}", "authentication_error")
    )
    store = InMemoryStore()
    session_id = new_session(store, "calc", "hello")

    result = run_agent(store, session_id, MODEL, options(anthropic_server))

    assert result.outcome == Outcome.FAILED
    assert len(anthropic_server.requests) == 1  # permanent: not retried
    assert sent_key(anthropic_server.requests[0]) == KEY  # it was sent
    session = store.session(session_id)
    assert session.status == SessionStatus.FAILED
    error = session.steps[-1]
    assert error.kind == StepKind.ERROR and error.payload["permanent"] is True
    assert "anthropic: 401 Unauthorized: invalid x-api-key: [redacted]" in error.payload["error"]
    assert "401 Unauthorized" in session.last_error
    assert_secret_nowhere(KEY, store, session_id, caplog)
    assert_secret_nowhere("SECRET-abc123", store, session_id, caplog)


def test_missing_key_fails_the_session_naming_the_setting(anthropic_server):
    store = InMemoryStore()
    session_id = new_session(store, "calc", "hello")

    result = run_agent(store, session_id, MODEL, {"anthropic_api_key": ""})

    assert result.outcome == Outcome.FAILED
    assert "ANTHROPIC_API_KEY" in store.session(session_id).last_error
    assert anthropic_server.requests == []


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (Reply(body="<html>502 Bad Gateway</html>", content_type="text/html"), "not JSON"),
        (Reply(body="", content_type="application/json"), "not JSON: an empty body"),
        (Reply(body=[1, 2]), "expected a JSON object, got an array"),
        (Reply(body={"id": "msg_1", "type": "message"}), "no 'content' array"),
        (Reply(body={"content": "hello"}), "no 'content' array"),
        (Reply(body={"content": [{"type": "text", "text": 7}]}), "content[0].text must be"),
        (
            Reply(body={"content": [{"type": "tool_use", "id": "t", "name": "x", "input": "1"}]}),
            "content[0].input must be an object, got a string",
        ),
        (
            Reply(body={"content": [{"type": "tool_use", "name": "x", "input": {}}]}),
            "content[0].id is missing",
        ),
        (
            Reply(body={"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}),
            "an error in a success response: busy",
        ),
    ],
    ids=[
        "html",
        "empty",
        "array",
        "no-content",
        "content-string",
        "text-number",
        "input-string",
        "tool-use-without-id",
        "error-body",
    ],
)
def test_malformed_response_is_a_clear_retryable_error(anthropic_server, reply, expected):
    anthropic_server.script(reply)

    with pytest.raises(ProviderError) as info:
        provider(anthropic_server).complete(HELLO, [], SETTINGS)

    assert not info.value.permanent and info.value.status == 200
    assert str(info.value).startswith("anthropic: malformed response (HTTP 200) from http://")
    assert expected in str(info.value)


def test_timeout_is_a_quick_retryable_error(anthropic_server):
    anthropic_server.script(Reply(body=anthropic_reply("too late").body, delay=10))
    settings = ModelSettings(model="claude-sonnet-4-5", timeout=0.3)

    started = time.monotonic()
    with pytest.raises(ProviderError) as info:
        provider(anthropic_server).complete(HELLO, [], settings)

    assert time.monotonic() - started < 2.0
    assert not info.value.permanent and info.value.status is None
    assert "no response from http://127.0.0.1:" in str(info.value)
    assert "within 0.3s" in str(info.value)


def test_connection_refused_is_retryable(monkeypatch):
    isolate_sdk_environment(monkeypatch)  # no proxy in between
    unreachable = AnthropicProvider(
        model="claude-sonnet-4-5",
        options={"anthropic_base_url": closed_port_url(), "anthropic_api_key": KEY},
    )
    with pytest.raises(ProviderError) as info:
        unreachable.complete(HELLO, [], SETTINGS)
    assert not info.value.permanent
    assert "anthropic: cannot reach http://127.0.0.1:" in str(info.value)
    assert "ConnectError" in str(info.value)


# --- Whole sessions -------------------------------------------------------------------


def test_calculator_agent_end_to_end(anthropic_server):
    anthropic_server.script(
        anthropic_reply(
            "Let me calculate.",
            (("toolu_abc", "calculator", {"expression": "(12*7)+3"}),),
            usage=(30, 8),
        ),
        anthropic_reply("(12*7)+3 = 87.", usage=(45, 6)),
    )
    store = InMemoryStore()
    session_id = new_session(store, "calc", "what is (12*7)+3?")

    result = run_agent(store, session_id, MODEL, options(anthropic_server))

    assert result.outcome == Outcome.COMPLETED
    assert result.final_answer == "(12*7)+3 = 87."
    steps = model_steps(store, session_id)
    assert [(s.tokens_in, s.tokens_out) for s in steps] == [(30, 8), (45, 6)]
    counters = store.session(session_id).checkpoints[-1].state.counters
    assert (counters.tokens_in, counters.tokens_out) == (75, 14)

    first, second = anthropic_server.bodies()
    assert first["system"] == SYSTEM_PROMPT
    assert first["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "what is (12*7)+3?"}]}
    ]
    assert [t["name"] for t in first["tools"]] == ["calculator"]
    assistant, results = second["messages"][1:]
    assert assistant == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me calculate."},
            {
                "type": "tool_use",
                "id": "toolu_abc",
                "name": "calculator",
                "input": {"expression": "(12*7)+3"},
            },
        ],
    }
    (block,) = results["content"]
    assert results["role"] == "user"
    assert block["type"] == "tool_result" and block["tool_use_id"] == "toolu_abc"
    assert "is_error" not in block
    assert json.loads(block["content"])["output"] == {"expression": "(12*7)+3", "value": 87}


def test_failed_tool_is_flagged_as_an_error_result(anthropic_server):
    anthropic_server.script(
        anthropic_reply(None, (("toolu_1", "calculator", {"expression": "1/0"}),)),
        anthropic_reply("Division by zero is undefined."),
    )
    store = InMemoryStore()
    session_id = new_session(store, "calc", "what is 1/0?")

    assert run_agent(store, session_id, MODEL, options(anthropic_server)).outcome == "completed"

    (block,) = anthropic_server.bodies()[1]["messages"][-1]["content"]
    assert block["is_error"] is True
    assert json.loads(block["content"])["error"] == "division by zero"


def test_resumed_session_sends_what_an_uninterrupted_one_would(anthropic_server):
    replies = (
        anthropic_reply(
            "Two sums.",
            (
                ("toolu_1", "calculator", {"expression": "6*7"}),
                ("toolu_2", "calculator", {"expression": "40+2"}),
            ),
        ),
        anthropic_reply("Both are 42."),
    )
    task = "what are 6*7 and 40+2?"
    reference = InMemoryStore()
    reference_id = new_session(reference, "calc", task)
    anthropic_server.script(*replies)
    assert run_agent(reference, reference_id, MODEL, options(anthropic_server)).outcome == (
        Outcome.COMPLETED
    )
    uninterrupted = list(anthropic_server.requests)
    # Both results of the parallel calls go back in one user turn.
    last_turn = uninterrupted[-1].json["messages"][-1]
    assert [b["tool_use_id"] for b in last_turn["content"]] == ["toolu_1", "toolu_2"]
    first_result = next(
        s for s in reference.session(reference_id).steps if s.kind == StepKind.TOOL_RESULT
    )

    anthropic_server.requests.clear()
    anthropic_server.script(*replies)
    store = InMemoryStore()
    session_id = new_session(store, "calc", task)
    # Every write but the user's first step is an append: die right after the one that
    # committed the first tool result (the second call has not run yet).
    crashing = CrashingStore(store, crash_at=first_result.seq - 1, after_commit=True)
    with pytest.raises(Crash):
        run_agent(crashing, session_id, MODEL, options(anthropic_server))
    assert len(anthropic_server.requests) == 1
    store.expire_lease(session_id)
    assert run_agent(store, session_id, MODEL, options(anthropic_server), worker="w2").outcome == (
        Outcome.COMPLETED
    )

    resumed = anthropic_server.requests
    assert len(resumed) == 2
    assert resumed[-1].json == uninterrupted[-1].json
    assert resumed[-1].raw == uninterrupted[-1].raw  # byte for byte, too
    runs = [s for s in store.session(session_id).steps if s.payload.get("event") == "run_started"]
    assert [r.payload["steps_after_checkpoint"] for r in runs] == [1, 5]
