"""RespawnSession keeps the SDK's Session contract where the SDK's own SQLiteSession keeps
it: the session settings' limit, settings given as a dict, a closed session refusing every
call, items that are not JSON refused, any text (a NUL character too) coming back exactly,
and importing the integration leaving the SDK's global state alone."""

from __future__ import annotations

import asyncio
import datetime
import json
import subprocess
import sys

import pytest
from agents import Runner, SQLiteSession
from agents.memory import SessionSettings

from sessions_app.models import Step

from ..conftest import ROOT
from ..stubs.sdk_model import sent_messages

pytestmark = pytest.mark.django_db(transaction=True)


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def run(coro):
    return asyncio.run(coro)


def test_get_items_uses_the_session_settings_limit(make_session):
    session = make_session("contract-limit", session_settings=SessionSettings(limit=2))
    run(session.add_items([user(str(n)) for n in range(5)]))
    assert run(session.get_items()) == [user("3"), user("4")]
    assert session.get_items_sync() == [user("3"), user("4")]
    # A limit given to the call wins over the settings' (as SQLiteSession's).
    assert run(session.get_items(limit=4)) == [user(str(n)) for n in range(1, 5)]


def test_session_settings_default_and_a_dict_is_normalised(make_session, sdk_model):
    from acme_sdk import run_config, support

    assert make_session("contract-default").session_settings == SessionSettings()
    session = make_session("contract-dict", session_settings={"limit": 2})
    assert session.session_settings == SessionSettings(limit=2)
    for text in ("one", "two", "three"):
        run(Runner.run(support, text, session=session, run_config=run_config))
    # The third run read the latest 2 items before its own input.
    assert [m["role"] for m in sent_messages(sdk_model)] == ["system", "user", "assistant", "user"]
    assert len(run(make_session("contract-dict").get_items(limit=100))) == 6


def test_a_session_closes_from_its_event_loop_as_the_sdks_do(make_session):
    """The SDK (and a program) may close a session inside a coroutine, as SQLiteSession
    allows: its connection is closed off the loop, where Django allows database calls."""
    session = make_session("contract-close-in-loop")

    async def use_then_close():
        await session.add_items([user("hello")])
        session.close()

    run(use_then_close())
    with pytest.raises(RuntimeError, match="is closed"):
        run(session.get_items())
    again = make_session("contract-close-in-loop")
    assert run(again.get_items()) == [user("hello")]


def test_a_closed_session_refuses_every_call_as_the_sdks_do(make_session, tmp_path):
    sqlite = SQLiteSession("closed", str(tmp_path / "s.sqlite3"))
    sqlite.close()
    with pytest.raises(RuntimeError, match="closed"):
        run(sqlite.get_items())
    session = make_session("contract-closed")
    run(session.add_items([user("before")]))
    session.close()
    calls = [
        lambda: run(session.get_items()),
        lambda: run(session.add_items([user("after")])),
        lambda: run(session.add_items([])),
        lambda: run(session.pop_item()),
        lambda: run(session.clear_session()),
        lambda: session.get_items_sync(),
        lambda: session.add_items_sync([user("after")]),
        lambda: session.pop_item_sync(),
        lambda: session.clear_session_sync(),
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match="RespawnSession 'contract-closed' is closed"):
            call()
    session.close()  # closing again does nothing
    # Nothing was written after the close.
    assert [s.payload["item"] for s in Step.objects.filter(session_id=session.respawn_id)] == [
        user("before")
    ]


def test_items_that_are_not_json_are_refused_not_stored_as_text(make_session, tmp_path):
    bad = {"role": "user", "content": "when", "at": datetime.datetime(2026, 12, 4)}
    sqlite = SQLiteSession("not-json", str(tmp_path / "s.sqlite3"))
    with pytest.raises(TypeError):
        run(sqlite.add_items([bad]))
    sqlite.close()
    session = make_session("contract-not-json")
    with pytest.raises(TypeError, match="must be JSON.*datetime"):
        run(session.add_items([user("fine"), bad]))
    with pytest.raises(TypeError, match="must be JSON"):
        run(session.add_items([{"role": "user", "content": "x", "score": float("nan")}]))
    assert run(session.get_items()) == []
    assert not Step.objects.filter(session_id=session.respawn_id).exists()


def test_any_text_comes_back_exactly_a_nul_character_too(make_session):
    session = make_session("contract-nul")
    items = [
        user("before\x00after"),
        {
            "type": "function_call",
            "call_id": "c\x001",
            "name": "f",
            "arguments": '{"a": "\\u0000"}',
        },
        {"type": "function_call_output", "call_id": "c\x001", "output": "\x00\ue000\ue0000 x"},
        {"role": "user", "content": [{"type": "input_text", "text": "\ue000e and \ue0000"}]},
        {"role": "user", "content": "plain", "k\x00ey": ["\x00", "\ue000"]},
    ]
    run(session.add_items(items))
    assert run(session.get_items()) == items
    assert run(make_session("contract-nul").get_items()) == items
    assert run(session.pop_item()) == items[-1]


PROGRAM = r"""
import json
from agents.tracing import get_trace_provider
before = bool(get_trace_provider()._disabled)
import django
django.setup()
import sessions_app.openai_agents
from sessions_app.openai_agents.session import OpenAIAgentRunner
from agents import Agent, RunConfig
after = bool(get_trace_provider()._disabled)
runner = OpenAIAgentRunner(Agent(name="a"), run_config=RunConfig())
print(json.dumps({"before": before, "after": after,
                  "runs_traced": not runner.run_config.tracing_disabled}))
"""


def test_importing_the_integration_leaves_the_sdks_tracing_alone():
    from ..conftest import program_env

    done = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        cwd=ROOT,
        env=program_env(OPENAI_AGENTS_DISABLE_TRACING="0"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # Tracing stays as the program had it; the workers' runs are the ones not traced.
    assert out == {"before": False, "after": False, "runs_traced": False}
