"""The OpenAI provider's own protocol: the real SDK over HTTP against a local Chat
Completions stub. What every provider must do is tested in test_provider_http.py."""

from __future__ import annotations

import json

import pytest

from agent_runtime.loop import Outcome
from agent_runtime.providers import ModelSettings, ModelTurn, ToolCall
from agent_runtime.providers.base import Usage
from agent_runtime.providers.openai import OpenAIProvider, parse_completion
from agent_runtime.state import StepKind
from agent_runtime.store import InMemoryStore
from demo_agents import calculator

from ..stubs.llm_servers import openai_reply
from .helpers import new_session
from .provider_kit import HELLO, KEY, SYSTEM_PROMPT, OpenAIKit, model_steps, run_agent


@pytest.fixture
def kit(openai_server) -> OpenAIKit:
    """Only the OpenAI provider here (the shared `kit` runs every provider)."""
    return OpenAIKit(openai_server)


# --- One turn -------------------------------------------------------------------------


def test_plain_text_answer(kit):
    kit.server.script(openai_reply("Hello there.", usage=(21, 3)))

    turn = kit.provider().complete(HELLO, [], kit.settings)

    assert turn == ModelTurn(text="Hello there.", tool_calls=[], usage=Usage(21, 3))
    (request,) = kit.server.requests
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


def test_tool_call_turn(kit):
    kit.server.script(
        openai_reply(None, (("call_1", "calculator", {"expression": "2+2"}),), usage=(40, 9))
    )

    turn = kit.provider().complete(HELLO, [calculator.spec], kit.settings)

    assert turn.text is None
    assert turn.tool_calls == [ToolCall("call_1", "calculator", {"expression": "2+2"})]
    assert turn.usage == Usage(40, 9)
    assert kit.server.requests[0].json["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "calculator",
                "description": calculator.spec.description,
                "parameters": calculator.spec.parameters,
            },
        }
    ]


def test_settings_reach_the_request(kit):
    kit.server.script(openai_reply("ok"))
    settings = ModelSettings(model="llama3.1", timeout=5.0, max_tokens=256, temperature=0.2)

    kit.provider().complete(HELLO, [], settings)

    body = kit.server.requests[0].json
    # A custom base URL is a compatible server: they all know max_tokens.
    assert (body["model"], body["max_tokens"], body["temperature"]) == ("llama3.1", 256, 0.2)


def test_custom_base_url_runs_without_a_key(kit):
    kit.server.script(openai_reply("ok"))
    local = OpenAIProvider(model="llama3.1", options={"openai_base_url": f"{kit.server.url}/v1"})

    assert local.complete(HELLO, [], kit.settings).text == "ok"
    assert kit.server.requests[0].headers["authorization"] == "Bearer unused"


# --- Arguments the model got wrong ----------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"expression": "1+', {"_invalid_json": '{"expression": "1+'}),
        ("[1, 2]", {"_invalid_json": "[1, 2]"}),
        ("", {}),
        ('{"expression":"10/4"}', {"expression": "10/4"}),
        ({"expression": "3*3"}, {"expression": "3*3"}),  # some servers send an object
    ],
    ids=["cut-off", "not-an-object", "empty", "compact", "object"],
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


def test_invalid_json_arguments_reach_the_model_as_a_tool_error(kit):
    kit.server.script(
        openai_reply(None, (("call_1", "calculator", '{"expression": "2+'),)),
        openai_reply("My call was broken; sorry."),
    )
    store = InMemoryStore()
    session_id = new_session(store, "calc", "what is 2+2?")

    result = run_agent(store, session_id, kit.model, kit.options())

    assert result.outcome == Outcome.COMPLETED
    (tool_result,) = [
        s.payload for s in store.session(session_id).steps if s.kind == StepKind.TOOL_RESULT
    ]
    assert tool_result["status"] == "error"
    assert "invalid arguments for calculator" in tool_result["error"]
    assert "_invalid_json" in tool_result["error"]
    # The model is shown what it sent (as valid JSON) and the tool's complaint.
    assistant, tool = kit.server.requests[1].json["messages"][2:]
    arguments = assistant["tool_calls"][0]["function"]["arguments"]
    assert json.loads(arguments) == {"_invalid_json": '{"expression": "2+'}
    assert tool["tool_call_id"] == "call_1"
    assert json.loads(tool["content"])["ok"] is False


# --- Whole sessions -------------------------------------------------------------------


def test_calculator_agent_end_to_end(kit):
    kit.server.script(
        openai_reply(
            "Let me calculate.",
            (("call_abc", "calculator", {"expression": "(12*7)+3"}),),
            usage=(30, 8),
        ),
        openai_reply("(12*7)+3 = 87.", usage=(45, 6)),
    )
    store = InMemoryStore()
    session_id = new_session(store, "calc", "what is (12*7)+3?")

    result = run_agent(store, session_id, kit.model, kit.options())

    assert result.outcome == Outcome.COMPLETED
    assert result.final_answer == "(12*7)+3 = 87."
    steps = model_steps(store, session_id)
    assert [(s.tokens_in, s.tokens_out) for s in steps] == [(30, 8), (45, 6)]
    assert steps[0].payload["usage"]["input_tokens"] == 30
    counters = store.session(session_id).checkpoints[-1].state.counters
    assert (counters.tokens_in, counters.tokens_out) == (75, 14)

    first, second = kit.server.bodies()
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
