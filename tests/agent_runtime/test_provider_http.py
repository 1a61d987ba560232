"""What the HTTP providers share: key scrubbing and reading servers' error bodies; over
HTTP, what every provider must do (errors classified, the key kept out of everything, a
resumed run sending what an uninterrupted one would), run once per provider through the
`kit` fixture against a local stub of its vendor's protocol."""

from __future__ import annotations

import logging
import time

import pytest

from agent_runtime.loop import Outcome
from agent_runtime.providers import ModelSettings, ProviderError
from agent_runtime.providers._http import Scrubber, is_permanent_status, server_detail
from agent_runtime.state import SessionStatus, StepKind
from agent_runtime.store import InMemoryStore
from demo_agents import calculator

from ..stubs.llm_servers import Reply
from .helpers import Crash, CrashingStore, new_session
from .provider_kit import HELLO, KEY, assert_secret_nowhere, closed_port_url, run_agent

CUSTOM_KEY = "my-custom-key-0000"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"bad key {CUSTOM_KEY}!", "bad key [redacted]!"),
        (
            "Incorrect API key provided: sk-proj-abcDEF123456",
            "Incorrect API key provided: [redacted]",
        ),
        ("masked: sk-test-*********c123.", "masked: [redacted]."),
        ("invalid sk-ant-api03-AbC_dEf-123", "invalid [redacted]"),
        ("header Authorization: Bearer abc.def.ghi-jkl", "header Authorization: Bearer [redacted]"),
        ('{"api_key": "zzz-123"}', '{"api_key": "[redacted]"}'),
        ("x-api-key=qwerty12", "x-api-key=[redacted]"),
        ("GET http://bob:hunter2@proxy:8080/v1", "GET http://[redacted]@proxy:8080/v1"),
        ("url https://h/v1?key=AIza123&x=1", "url https://h/v1?key=[redacted]&x=1"),
        ("a bearer token is missing; task-force risk-free", None),
    ],
)
def test_scrubber_removes_the_key_and_key_shaped_text(text, expected):
    assert Scrubber([CUSTOM_KEY])(text) == (text if expected is None else expected)


def test_scrubber_ignores_empty_and_tiny_secrets():
    assert Scrubber(["", "a"])("a plain message") == "a plain message"


@pytest.mark.parametrize(
    ("status", "permanent"),
    [(400, True), (401, True), (402, True), (413, True), (408, False), (409, False)]
    + [(429, False), (500, False), (529, False)],
)
def test_status_classification(status, permanent):
    assert is_permanent_status(status) is permanent


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"message": "openai-style, unwrapped by the SDK"}, "openai-style, unwrapped by the SDK"),
        ({"type": "error", "error": {"message": "anthropic-style"}}, "anthropic-style"),
        ({"object": "error", "message": "vLLM", "code": 400}, "vLLM"),
        ({"detail": "Not Found"}, "Not Found"),
        ({"error": "model 'x' not found"}, "model 'x' not found"),
        ("<html>\n  <h1>502</h1>\n</html>", "<html> <h1>502</h1> </html>"),
        ({"weird": [1]}, '{"weird": [1]}'),
        (None, ""),
    ],
)
def test_server_detail_reads_the_usual_error_shapes(body, expected):
    assert server_detail(body) == expected


def test_server_detail_is_kept_short():
    assert len(server_detail("x" * 5000)) == 500


# --- Over HTTP: what every provider must do, each against its own protocol's stub ----------


def test_parallel_tool_calls_in_one_turn(kit):
    kit.server.script(
        kit.reply(
            "Working on all three.",
            (
                ("call_a", "calculator", {"expression": "1+1"}),
                ("call_b", "calculator", {"expression": "2*3"}),
                ("call_c", "calculator", {"expression": "10/4"}),
            ),
        )
    )

    turn = kit.provider().complete(HELLO, [calculator.spec], kit.settings)

    assert turn.text == "Working on all three."
    assert [(c.id, c.arguments["expression"]) for c in turn.tool_calls] == [
        ("call_a", "1+1"),
        ("call_b", "2*3"),
        ("call_c", "10/4"),
    ]


def test_missing_key_is_a_permanent_error_naming_the_setting(kit):
    with pytest.raises(ProviderError) as info:
        kit.provider(kit.without_key)
    assert info.value.permanent
    assert kit.key_setting in str(info.value)


def test_missing_key_fails_the_session_naming_the_setting(kit):
    store = InMemoryStore()
    session_id = new_session(store, "calc", "hello")

    result = run_agent(store, session_id, kit.model, kit.without_key)

    assert result.outcome == Outcome.FAILED
    assert kit.key_setting in store.session(session_id).last_error
    assert kit.server.requests == []


@pytest.mark.parametrize(
    ("status", "permanent"),
    [(400, True), (401, True), (403, True), (404, True), (413, True), (422, True)]
    + [(408, False), (429, False), (500, False), (502, False), (503, False), (529, False)],
)
def test_http_errors_are_classified(kit, status, permanent):
    kit.server.script(kit.error(status, "the server's own words"))

    with pytest.raises(ProviderError) as info:
        kit.provider().complete(HELLO, [], kit.settings)

    assert (info.value.status, info.value.permanent) == (status, permanent)
    assert str(info.value).startswith(f"{kit.name}: {status} ")
    assert str(info.value).endswith(": the server's own words")
    assert len(kit.server.requests) == 1  # the SDK's own retries are off


def test_rate_limit_then_success_completes_the_session(kit):
    kit.server.script(kit.rate_limited(), kit.reply("All good."))
    store = InMemoryStore()
    session_id = new_session(store, "calc", "hello")

    result = run_agent(store, session_id, kit.model, kit.options())

    assert result.outcome == Outcome.COMPLETED
    assert result.final_answer == "All good."
    assert len(kit.server.requests) == 2
    assert kit.server.requests[0].raw == kit.server.requests[1].raw


def test_unauthorized_fails_the_session_clearly_without_the_key(kit, caplog):
    caplog.set_level(logging.DEBUG)  # the SDKs' and HTTP clients' debug logs too
    server_says, recorded = kit.unauthorized
    kit.server.script(kit.error(401, server_says))
    store = InMemoryStore()
    session_id = new_session(store, "calc", "hello")

    result = run_agent(store, session_id, kit.model, kit.options())

    assert result.outcome == Outcome.FAILED
    assert len(kit.server.requests) == 1  # permanent: not retried
    assert kit.sent_key(kit.server.requests[0]) == KEY  # it was sent
    session = store.session(session_id)
    assert session.status == SessionStatus.FAILED
    error = session.steps[-1]
    assert error.kind == StepKind.ERROR and error.payload["permanent"] is True
    assert error.payload["error"].endswith(recorded)
    assert "401 Unauthorized" in session.last_error
    assert_secret_nowhere(KEY, store, session_id, caplog)
    assert_secret_nowhere("SECRET-abc123", store, session_id, caplog)


def _malformed(kit_name: str, case: str, body: object, expected: str, **reply: object):
    return pytest.param(kit_name, Reply(body=body, **reply), expected, id=f"{kit_name}-{case}")


MALFORMED = [
    case
    for name in ("anthropic", "openai")
    for case in (
        _malformed(
            name, "html", "<html>502 Bad Gateway</html>", "not JSON", content_type="text/html"
        ),
        _malformed(name, "empty", "", "not JSON: an empty body"),
        _malformed(name, "array", [1, 2], "expected a JSON object, got an array"),
    )
] + [
    _malformed(
        "openai", "no-choices", {"id": "chatcmpl-1", "object": "chat.completion"}, "no 'choices'"
    ),
    _malformed("openai", "choices-not-array", {"choices": "nope"}, "no 'choices'"),
    _malformed(
        "openai", "no-message", {"choices": [{"index": 0}]}, "choices[0].message is missing"
    ),
    _malformed(
        "openai",
        "content-number",
        {"choices": [{"message": {"role": "assistant", "content": 42}}]},
        "content must be a string or null, got a number",
    ),
    _malformed(
        "openai",
        "no-content",
        {"choices": [{"message": {"role": "assistant"}}]},
        "neither content nor tool calls",
    ),
    _malformed(
        "openai",
        "call-without-name",
        {
            "choices": [
                {
                    "message": {
                        "role": "assistant",
                        "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}],
                    }
                }
            ]
        },
        "tool_calls[0].function.name is missing",
    ),
    _malformed("anthropic", "no-content", {"id": "msg_1", "type": "message"}, "no 'content' array"),
    _malformed("anthropic", "content-string", {"content": "hello"}, "no 'content' array"),
    _malformed(
        "anthropic",
        "text-number",
        {"content": [{"type": "text", "text": 7}]},
        "content[0].text must be",
    ),
    _malformed(
        "anthropic",
        "input-string",
        {"content": [{"type": "tool_use", "id": "t", "name": "x", "input": "1"}]},
        "content[0].input must be an object, got a string",
    ),
    _malformed(
        "anthropic",
        "tool-use-without-id",
        {"content": [{"type": "tool_use", "name": "x", "input": {}}]},
        "content[0].id is missing",
    ),
    _malformed(
        "anthropic",
        "error-body",
        {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}},
        "an error in a success response: busy",
    ),
]


@pytest.mark.parametrize(("kit", "reply", "expected"), MALFORMED, indirect=["kit"])
def test_malformed_response_is_a_clear_retryable_error(kit, reply, expected):
    kit.server.script(reply)

    with pytest.raises(ProviderError) as info:
        kit.provider().complete(HELLO, [], kit.settings)

    assert not info.value.permanent and info.value.status == 200
    assert str(info.value).startswith(f"{kit.name}: malformed response (HTTP 200) from http://")
    assert expected in str(info.value)


def test_timeout_is_a_quick_retryable_error(kit):
    kit.server.script(Reply(body=kit.reply("too late").body, delay=10))
    settings = ModelSettings(model=kit.settings.model, timeout=0.3)

    started = time.monotonic()
    with pytest.raises(ProviderError) as info:
        kit.provider().complete(HELLO, [], settings)

    assert time.monotonic() - started < 2.0
    assert not info.value.permanent and info.value.status is None
    assert "no response from http://127.0.0.1:" in str(info.value)
    assert "within 0.3s" in str(info.value)


def test_connection_refused_is_retryable(kit):
    unreachable = kit.provider(kit.options(base_url=closed_port_url()))
    with pytest.raises(ProviderError) as info:
        unreachable.complete(HELLO, [], kit.settings)
    assert not info.value.permanent
    assert f"{kit.name}: cannot reach http://127.0.0.1:" in str(info.value)
    assert "ConnectError" in str(info.value)


def test_resumed_session_sends_what_an_uninterrupted_one_would(kit):
    replies = (
        kit.reply(
            "Two sums.",
            (
                ("call_1", "calculator", {"expression": "6*7"}),
                ("call_2", "calculator", {"expression": "40+2"}),
            ),
        ),
        kit.reply("Both are 42."),
    )
    task = "what are 6*7 and 40+2?"
    reference = InMemoryStore()
    reference_id = new_session(reference, "calc", task)
    kit.server.script(*replies)
    assert run_agent(reference, reference_id, kit.model, kit.options()).outcome == (
        Outcome.COMPLETED
    )
    uninterrupted = list(kit.server.requests)
    first_result = next(
        s for s in reference.session(reference_id).steps if s.kind == StepKind.TOOL_RESULT
    )

    kit.server.requests.clear()
    kit.server.script(*replies)
    store = InMemoryStore()
    session_id = new_session(store, "calc", task)
    # Die right after the append that committed the first tool result (the second call
    # has not run yet).
    crashing = CrashingStore(store, at_seq=first_result.seq, after_commit=True)
    with pytest.raises(Crash):
        run_agent(crashing, session_id, kit.model, kit.options())
    assert len(kit.server.requests) == 1
    store.expire_lease(session_id)
    assert run_agent(store, session_id, kit.model, kit.options(), worker="w2").outcome == (
        Outcome.COMPLETED
    )

    resumed = kit.server.requests
    assert len(resumed) == 2
    assert resumed[-1].json == uninterrupted[-1].json
    assert resumed[-1].raw == uninterrupted[-1].raw  # byte for byte, too
    runs = [s for s in store.session(session_id).steps if s.payload.get("event") == "run_started"]
    assert [r.payload["steps_after_checkpoint"] for r in runs] == [1, 5]
