"""The OpenAI provider: the real SDK over HTTP against a local Chat Completions stub."""

from __future__ import annotations

import json
import logging
import time

import pytest

from agent_runtime.agents import calculator
from agent_runtime.loop import Outcome
from agent_runtime.providers import Message, ModelSettings, ModelTurn, ProviderError, ToolCall
from agent_runtime.providers.base import Usage
from agent_runtime.providers.openai import OpenAIProvider, parse_completion
from agent_runtime.state import SessionStatus, StepKind
from agent_runtime.store import InMemoryStore

from ..stubs.llm_servers import Reply, isolate_sdk_environment, openai_error, openai_reply
from .helpers import Crash, CrashingStore, new_session
from .provider_kit import (
    KEY,
    SYSTEM_PROMPT,
    assert_secret_nowhere,
    closed_port_url,
    run_agent,
)

MODEL = "openai:gpt-4o-mini"
SETTINGS = ModelSettings(model="gpt-4o-mini", timeout=5.0)
HELLO = [Message("system", "Be brief."), Message("user", "hi")]


def options(server, **extra):
    return {"openai_base_url": f"{server.url}/v1", "openai_api_key": KEY, **extra}


def provider(server, **extra) -> OpenAIProvider:
    return OpenAIProvider(model="gpt-4o-mini", options=options(server, **extra))


def model_steps(store, session_id):
    return [s for s in store.session(session_id).steps if s.kind == StepKind.MODEL]


# --- One turn -------------------------------------------------------------------------


def test_plain_text_answer(openai_server):
    openai_server.script(openai_reply("Hello there.", usage=(21, 3)))

    turn = provider(openai_server).complete(HELLO, [], SETTINGS)

    assert turn == ModelTurn(text="Hello there.", tool_calls=[], usage=Usage(21, 3))
    (request,) = openai_server.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    # No tools offered: the field is left out (an empty list is refused).
    assert request.json == {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
        ],
    }


def test_tool_call_turn(openai_server):
    openai_server.script(
        openai_reply(None, (("call_1", "calculator", {"expression": "2+2"}),), usage=(40, 9))
    )

    turn = provider(openai_server).complete(HELLO, [calculator.spec], SETTINGS)

    assert turn.text is None
    assert turn.tool_calls == [ToolCall("call_1", "calculator", {"expression": "2+2"})]
    assert turn.usage == Usage(40, 9)
    assert openai_server.requests[0].json["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "calculator",
                "description": calculator.spec.description,
                "parameters": calculator.spec.parameters,
            },
        }
    ]


def test_parallel_tool_calls_in_one_turn(openai_server):
    openai_server.script(
        openai_reply(
            "Working on all three.",
            (
                ("call_a", "calculator", {"expression": "1+1"}),
                ("call_b", "calculator", {"expression": "2*3"}),
                ("call_c", "calculator", '{"expression":"10/4"}'),
            ),
        )
    )

    turn = provider(openai_server).complete(HELLO, [calculator.spec], SETTINGS)

    assert turn.text == "Working on all three."
    assert [(c.id, c.arguments["expression"]) for c in turn.tool_calls] == [
        ("call_a", "1+1"),
        ("call_b", "2*3"),
        ("call_c", "10/4"),
    ]


def test_settings_reach_the_request(openai_server):
    openai_server.script(openai_reply("ok"))
    settings = ModelSettings(model="llama3.1", timeout=5.0, max_tokens=256, temperature=0.2)

    provider(openai_server).complete(HELLO, [], settings)

    body = openai_server.requests[0].json
    # A custom base URL is a compatible server: they all know max_tokens.
    assert (body["model"], body["max_tokens"], body["temperature"]) == ("llama3.1", 256, 0.2)


def test_custom_base_url_runs_without_a_key(openai_server):
    openai_server.script(openai_reply("ok"))
    local = OpenAIProvider(model="llama3.1", options={"openai_base_url": f"{openai_server.url}/v1"})

    assert local.complete(HELLO, [], SETTINGS).text == "ok"
    assert openai_server.requests[0].headers["authorization"] == "Bearer unused"


def test_missing_key_is_a_permanent_error_naming_the_setting():
    with pytest.raises(ProviderError) as info:
        OpenAIProvider(model="gpt-4o-mini", options={"openai_api_key": "", "openai_base_url": ""})
    assert info.value.permanent
    assert "OPENAI_API_KEY" in str(info.value)


# --- Arguments the model got wrong ----------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"expression": "1+', {"_invalid_json": '{"expression": "1+'}),
        ("[1, 2]", {"_invalid_json": "[1, 2]"}),
        ("", {}),
        ({"expression": "3*3"}, {"expression": "3*3"}),  # some servers send an object
    ],
    ids=["cut-off", "not-an-object", "empty", "object"],
)
def test_tool_call_arguments_are_decoded_or_kept_for_validation(arguments, expected):
    body = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "calculator", "arguments": arguments},
                        }
                    ],
                }
            }
        ]
    }
    assert parse_completion(json.dumps(body)).tool_calls[0].arguments == expected


def test_missing_or_repeated_call_ids_are_made_unique():
    calls = [
        {"function": {"name": "calculator", "arguments": "{}"}},
        {"id": "dup", "function": {"name": "calculator", "arguments": "{}"}},
        {"id": "dup", "function": {"name": "calculator", "arguments": "{}"}},
    ]
    body = {"choices": [{"message": {"role": "assistant", "tool_calls": calls}}]}
    ids = [c.id for c in parse_completion(json.dumps(body)).tool_calls]
    assert ids[1] == "dup" and len(set(ids)) == 3 and all(ids)


def test_invalid_json_arguments_reach_the_model_as_a_tool_error(openai_server):
    openai_server.script(
        openai_reply(None, (("call_1", "calculator", '{"expression": "2+'),)),
        openai_reply("My call was broken; sorry."),
    )
    store = InMemoryStore()
    session_id = new_session(store, "calc", "what is 2+2?")

    result = run_agent(store, session_id, MODEL, options(openai_server))

    assert result.outcome == Outcome.COMPLETED
    (tool_result,) = [
        s.payload for s in store.session(session_id).steps if s.kind == StepKind.TOOL_RESULT
    ]
    assert tool_result["status"] == "error"
    assert "invalid arguments for calculator" in tool_result["error"]
    assert "_invalid_json" in tool_result["error"]
    # The model is shown what it sent (as valid JSON) and the tool's complaint.
    assistant, tool = openai_server.requests[1].json["messages"][2:]
    arguments = assistant["tool_calls"][0]["function"]["arguments"]
    assert json.loads(arguments) == {"_invalid_json": '{"expression": "2+'}
    assert tool["tool_call_id"] == "call_1"
    assert json.loads(tool["content"])["ok"] is False


# --- Failures -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "permanent"),
    [
        (400, True),
        (401, True),
        (403, True),
        (404, True),
        (422, True),
        (408, False),
        (429, False),
        (500, False),
        (502, False),
        (503, False),
    ],
)
def test_http_errors_are_classified(openai_server, status, permanent):
    openai_server.script(openai_error(status, "the server's own words"))

    with pytest.raises(ProviderError) as info:
        provider(openai_server).complete(HELLO, [], SETTINGS)

    assert (info.value.status, info.value.permanent) == (status, permanent)
    assert str(info.value).startswith(f"openai: {status} ")
    assert str(info.value).endswith(": the server's own words")
    assert len(openai_server.requests) == 1  # the SDK's own retries are off


def test_rate_limit_then_success_completes_the_session(openai_server):
    openai_server.script(
        openai_error(429, "Rate limit reached for gpt-4o-mini", "requests"),
        openai_reply("All good."),
    )
    store = InMemoryStore()
    session_id = new_session(store, "calc", "hello")

    result = run_agent(store, session_id, MODEL, options(openai_server))

    assert result.outcome == Outcome.COMPLETED
    assert result.final_answer == "All good."
    assert len(openai_server.requests) == 2
    assert openai_server.requests[0].raw == openai_server.requests[1].raw


def test_unauthorized_fails_the_session_clearly_without_the_key(openai_server, caplog):
    caplog.set_level(logging.DEBUG)  # the SDKs' and HTTP clients' debug logs too
    openai_server.script(openai_error(401, f"Incorrect API key provided: {KEY}. Check your key."))
    store = InMemoryStore()
    session_id = new_session(store, "calc", "hello")

    result = run_agent(store, session_id, MODEL, options(openai_server))

    assert result.outcome == Outcome.FAILED
    assert len(openai_server.requests) == 1  # permanent: not retried
    assert openai_server.requests[0].headers["authorization"] == f"Bearer {KEY}"  # it was sent
    session = store.session(session_id)
    assert session.status == SessionStatus.FAILED
    error = session.steps[-1]
    assert error.kind == StepKind.ERROR and error.payload["permanent"] is True
    expected = "openai: 401 Unauthorized: Incorrect API key provided: [redacted]. Check your key."
    assert error.payload["error"].endswith(expected)
    assert "401 Unauthorized" in session.last_error
    assert_secret_nowhere(KEY, store, session_id, caplog)
    assert_secret_nowhere("SECRET-abc123", store, session_id, caplog)


def test_missing_key_fails_the_session_naming_the_setting(openai_server):
    store = InMemoryStore()
    session_id = new_session(store, "calc", "hello")

    result = run_agent(store, session_id, MODEL, {"openai_api_key": "", "openai_base_url": ""})

    assert result.outcome == Outcome.FAILED
    assert "OPENAI_API_KEY" in store.session(session_id).last_error
    assert openai_server.requests == []


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (Reply(body="<html>502 Bad Gateway</html>", content_type="text/html"), "not JSON"),
        (Reply(body=[1, 2]), "expected a JSON object, got an array"),
        (Reply(body={"id": "chatcmpl-1", "object": "chat.completion"}), "no 'choices'"),
        (Reply(body={"choices": "nope"}), "no 'choices'"),
        (Reply(body={"choices": [{"index": 0}]}), "choices[0].message is missing"),
        (
            Reply(body={"choices": [{"message": {"role": "assistant", "content": 42}}]}),
            "content must be a string or null, got a number",
        ),
        (
            Reply(body={"choices": [{"message": {"role": "assistant"}}]}),
            "neither content nor tool calls",
        ),
        (
            Reply(
                body={
                    "choices": [
                        {
                            "message": {
                                "role": "assistant",
                                "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}],
                            }
                        }
                    ]
                }
            ),
            "tool_calls[0].function.name is missing",
        ),
    ],
    ids=[
        "html",
        "array",
        "no-choices",
        "choices-not-array",
        "no-message",
        "content-number",
        "no-content",
        "call-without-name",
    ],
)
def test_malformed_response_is_a_clear_retryable_error(openai_server, reply, expected):
    openai_server.script(reply)

    with pytest.raises(ProviderError) as info:
        provider(openai_server).complete(HELLO, [], SETTINGS)

    assert not info.value.permanent and info.value.status == 200
    assert str(info.value).startswith("openai: malformed response (HTTP 200) from http://")
    assert expected in str(info.value)


def test_timeout_is_a_quick_retryable_error(openai_server):
    openai_server.script(Reply(body=openai_reply("too late").body, delay=10))
    settings = ModelSettings(model="gpt-4o-mini", timeout=0.3)

    started = time.monotonic()
    with pytest.raises(ProviderError) as info:
        provider(openai_server).complete(HELLO, [], settings)

    assert time.monotonic() - started < 2.0
    assert not info.value.permanent and info.value.status is None
    assert "no response from http://127.0.0.1:" in str(info.value)
    assert "within 0.3s" in str(info.value)


def test_connection_refused_is_retryable(monkeypatch):
    isolate_sdk_environment(monkeypatch)  # no proxy in between
    unreachable = OpenAIProvider(
        model="gpt-4o-mini",
        options={"openai_base_url": f"{closed_port_url()}/v1", "openai_api_key": KEY},
    )
    with pytest.raises(ProviderError) as info:
        unreachable.complete(HELLO, [], SETTINGS)
    assert not info.value.permanent
    assert "openai: cannot reach http://127.0.0.1:" in str(info.value)
    assert "ConnectError" in str(info.value)


# --- Whole sessions -------------------------------------------------------------------


def test_calculator_agent_end_to_end(openai_server):
    openai_server.script(
        openai_reply(
            "Let me calculate.",
            (("call_abc", "calculator", {"expression": "(12*7)+3"}),),
            usage=(30, 8),
        ),
        openai_reply("(12*7)+3 = 87.", usage=(45, 6)),
    )
    store = InMemoryStore()
    session_id = new_session(store, "calc", "what is (12*7)+3?")

    result = run_agent(store, session_id, MODEL, options(openai_server))

    assert result.outcome == Outcome.COMPLETED
    assert result.final_answer == "(12*7)+3 = 87."
    steps = model_steps(store, session_id)
    assert [(s.tokens_in, s.tokens_out) for s in steps] == [(30, 8), (45, 6)]
    assert steps[0].payload["usage"]["input_tokens"] == 30
    counters = store.session(session_id).checkpoints[-1].state.counters
    assert (counters.tokens_in, counters.tokens_out) == (75, 14)

    first, second = openai_server.bodies()
    assert first["messages"] == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "what is (12*7)+3?"},
    ]
    assert [t["function"]["name"] for t in first["tools"]] == ["calculator"]
    assistant, tool = second["messages"][2:]
    assert assistant == {
        "role": "assistant",
        "content": "Let me calculate.",
        "tool_calls": [
            {
                "id": "call_abc",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "(12*7)+3"}'},
            }
        ],
    }
    assert tool["role"] == "tool" and tool["tool_call_id"] == "call_abc"
    assert json.loads(tool["content"])["output"] == {"expression": "(12*7)+3", "value": 87}


def test_resumed_session_sends_what_an_uninterrupted_one_would(openai_server):
    replies = (
        openai_reply(
            "Two sums.",
            (
                ("call_1", "calculator", {"expression": "6*7"}),
                ("call_2", "calculator", {"expression": "40+2"}),
            ),
        ),
        openai_reply("Both are 42."),
    )
    task = "what are 6*7 and 40+2?"
    reference = InMemoryStore()
    reference_id = new_session(reference, "calc", task)
    openai_server.script(*replies)
    assert run_agent(reference, reference_id, MODEL, options(openai_server)).outcome == "completed"
    uninterrupted = list(openai_server.requests)
    first_result = next(
        s for s in reference.session(reference_id).steps if s.kind == StepKind.TOOL_RESULT
    )

    openai_server.requests.clear()
    openai_server.script(*replies)
    store = InMemoryStore()
    session_id = new_session(store, "calc", task)
    # Every write but the user's first step is an append: die right after the one that
    # committed the first tool result (the second call has not run yet).
    crashing = CrashingStore(store, crash_at=first_result.seq - 1, after_commit=True)
    with pytest.raises(Crash):
        run_agent(crashing, session_id, MODEL, options(openai_server))
    assert len(openai_server.requests) == 1
    store.expire_lease(session_id)
    assert run_agent(store, session_id, MODEL, options(openai_server), worker="w2").outcome == (
        Outcome.COMPLETED
    )

    resumed = openai_server.requests
    assert len(resumed) == 2
    assert resumed[-1].json == uninterrupted[-1].json
    assert resumed[-1].raw == uninterrupted[-1].raw  # byte for byte, too
    runs = [s for s in store.session(session_id).steps if s.payload.get("event") == "run_started"]
    assert [r.payload["steps_after_checkpoint"] for r in runs] == [1, 5]
