"""The Anthropic provider's own protocol: the real SDK over HTTP against a local Messages
API stub. What every provider must do is tested in test_provider_http.py."""

from __future__ import annotations

import json

import pytest

from agent_runtime.loop import Outcome
from agent_runtime.providers import Message, ModelSettings, ModelTurn, ToolCall
from agent_runtime.providers.anthropic import conversation
from agent_runtime.providers.base import Usage
from agent_runtime.store import InMemoryStore
from demo_agents import calculator

from ..stubs.llm_servers import anthropic_reply
from .helpers import new_session
from .provider_kit import HELLO, KEY, SYSTEM_PROMPT, AnthropicKit, model_steps, run_agent


@pytest.fixture
def kit(anthropic_server) -> AnthropicKit:
    """Only the Anthropic provider here (the shared `kit` runs every provider)."""
    return AnthropicKit(anthropic_server)


# --- One turn -------------------------------------------------------------------------


def test_plain_text_answer(kit):
    kit.server.script(anthropic_reply("Hello there.", usage=(21, 3)))

    turn = kit.provider().complete(HELLO, [], kit.settings)

    assert turn == ModelTurn(text="Hello there.", tool_calls=[], usage=Usage(21, 3))
    (request,) = kit.server.requests
    assert request.path == "/v1/messages"
    assert kit.sent_key(request) == KEY
    assert request.headers["anthropic-version"]
    # The system prompt is a parameter; max_tokens is required, so it has a default.
    assert request.json == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 4096,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }


def test_tool_call_turn(kit):
    kit.server.script(
        anthropic_reply(None, (("toolu_1", "calculator", {"expression": "2+2"}),), usage=(40, 9))
    )

    turn = kit.provider().complete(HELLO, [calculator.spec], kit.settings)

    assert turn.text is None
    assert turn.tool_calls == [ToolCall("toolu_1", "calculator", {"expression": "2+2"})]
    assert turn.usage == Usage(40, 9)
    assert kit.server.requests[0].json["tools"] == [
        {
            "name": "calculator",
            "description": calculator.spec.description,
            "input_schema": calculator.spec.parameters,
        }
    ]


def test_settings_reach_the_request(kit):
    kit.server.script(anthropic_reply("ok"))
    settings = ModelSettings(model="claude-haiku-4-5", timeout=5.0, max_tokens=256, temperature=0)

    kit.provider().complete(HELLO, [], settings)

    body = kit.server.requests[0].json
    assert (body["model"], body["max_tokens"]) == ("claude-haiku-4-5", 256)
    assert "temperature" not in body  # this API version has none


def test_cached_input_counts_as_input(kit):
    reply = anthropic_reply("ok", usage=(10, 4))
    reply.body["usage"].update(cache_creation_input_tokens=100, cache_read_input_tokens=1000)
    kit.server.script(reply)

    turn = kit.provider().complete(HELLO, [], kit.settings)

    assert turn.usage == Usage(
        input_tokens=1110, output_tokens=4, cache_read_tokens=1000, cache_write_tokens=100
    )


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


# --- Whole sessions -------------------------------------------------------------------


def test_calculator_agent_end_to_end(kit):
    kit.server.script(
        anthropic_reply(
            "Let me calculate.",
            (("toolu_abc", "calculator", {"expression": "(12*7)+3"}),),
            usage=(30, 8),
        ),
        anthropic_reply("(12*7)+3 = 87.", usage=(45, 6)),
    )
    store = InMemoryStore()
    session_id = new_session(store, "calc", "what is (12*7)+3?")

    result = run_agent(store, session_id, kit.model, kit.options())

    assert result.outcome == Outcome.COMPLETED
    assert result.final_answer == "(12*7)+3 = 87."
    steps = model_steps(store, session_id)
    assert [(s.tokens_in, s.tokens_out) for s in steps] == [(30, 8), (45, 6)]
    counters = store.session(session_id).checkpoints[-1].state.counters
    assert (counters.tokens_in, counters.tokens_out) == (75, 14)

    first, second = kit.server.bodies()
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


def test_failed_tool_is_flagged_as_an_error_result(kit):
    kit.server.script(
        anthropic_reply(None, (("toolu_1", "calculator", {"expression": "1/0"}),)),
        anthropic_reply("Division by zero is undefined."),
    )
    store = InMemoryStore()
    session_id = new_session(store, "calc", "what is 1/0?")

    assert run_agent(store, session_id, kit.model, kit.options()).outcome == "completed"

    (block,) = kit.server.bodies()[1]["messages"][-1]["content"]
    assert block["is_error"] is True
    assert json.loads(block["content"])["error"] == "division by zero"


def test_results_of_parallel_calls_go_back_in_one_user_turn(kit):
    kit.server.script(
        anthropic_reply(
            "Two sums.",
            (
                ("toolu_1", "calculator", {"expression": "6*7"}),
                ("toolu_2", "calculator", {"expression": "40+2"}),
            ),
        ),
        anthropic_reply("Both are 42."),
    )
    store = InMemoryStore()
    session_id = new_session(store, "calc", "what are 6*7 and 40+2?")

    assert run_agent(store, session_id, kit.model, kit.options()).outcome == Outcome.COMPLETED

    last_turn = kit.server.requests[-1].json["messages"][-1]
    assert [b["tool_use_id"] for b in last_turn["content"]] == ["toolu_1", "toolu_2"]
