"""RespawnSession against the SDK's session contract (ordering, limits, pop, clear,
isolation, concurrency) and with the SDK's real Runner talking to a local model over HTTP:
a conversation over several turns, its items as steps of the trace."""

from __future__ import annotations

import asyncio
import threading

import pytest
from agents import Runner
from agents.memory import Session
from django.db import connections

from sessions_app.models import AgentSession, Checkpoint, Step
from sessions_app.openai_agents.session import RespawnSession, SessionBusy, session_id_for

from ..stubs.sdk_model import sent_messages

pytestmark = pytest.mark.django_db(transaction=True)


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {
        "type": "message",
        "role": "assistant",
        "id": "msg-1",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def run(coro):
    return asyncio.run(coro)


def test_it_is_an_sdk_session(make_session):
    session = make_session("conv-1")
    assert isinstance(session, Session)
    assert session.session_id == "conv-1"


def test_items_come_back_in_the_order_they_were_added(make_session):
    session = make_session("conv-order")
    run(session.add_items([user("one"), assistant("two")]))
    run(session.add_items([user("three")]))
    assert run(session.get_items()) == [user("one"), assistant("two"), user("three")]


def test_limit_returns_the_latest_items_oldest_first(make_session):
    session = make_session("conv-limit")
    run(session.add_items([user(str(n)) for n in range(5)]))
    assert run(session.get_items(limit=2)) == [user("3"), user("4")]
    assert run(session.get_items(limit=10)) == [user(str(n)) for n in range(5)]
    assert run(session.get_items(limit=0)) == []
    with pytest.raises(ValueError, match="limit must be None or an integer >= 0"):
        run(session.get_items(limit=-1))


def test_pop_returns_the_latest_item_and_none_when_empty(make_session):
    session = make_session("conv-pop")
    assert run(session.pop_item()) is None
    run(session.add_items([user("a"), user("b")]))
    assert run(session.pop_item()) == user("b")
    assert run(session.get_items()) == [user("a")]
    assert run(session.pop_item()) == user("a")
    assert run(session.pop_item()) is None
    # History is kept: the popped steps are superseded, and a step says so.
    steps = Step.objects.filter(session_id=session.respawn_id).order_by("seq")
    assert [s.superseded_at is not None for s in steps if s.kind == "user"] == [True, True]
    assert [s.payload["event"] for s in steps if s.kind == "system"] == [
        "sdk_item_popped",
        "sdk_item_popped",
    ]
    # What is left after a pop is a consistent point: the head checkpoint is there.
    row = AgentSession.objects.get(id=session.respawn_id)
    assert (
        row.head == row.last_seq and Checkpoint.objects.filter(session=row, seq=row.head).exists()
    )


def test_clear_empties_the_session_and_keeps_the_history(make_session):
    session = make_session("conv-clear")
    run(session.add_items([user("a"), assistant("b")]))
    run(session.clear_session())
    assert run(session.get_items()) == []
    assert run(session.pop_item()) is None
    run(session.add_items([user("c")]))
    assert run(session.get_items()) == [user("c")]
    assert (
        Step.objects.filter(session_id=session.respawn_id, superseded_at__isnull=False).count() == 2
    )


def test_sessions_are_isolated(make_session):
    first, second = make_session("conv-a"), make_session("conv-b")
    run(first.add_items([user("for a")]))
    run(second.add_items([user("for b")]))
    assert run(first.get_items()) == [user("for a")]
    assert run(second.get_items()) == [user("for b")]
    run(first.clear_session())
    assert run(second.get_items()) == [user("for b")]
    assert first.respawn_id != second.respawn_id


def test_two_objects_for_one_id_share_the_conversation(make_session):
    run(make_session("conv-shared").add_items([user("hello")]))
    assert run(make_session("conv-shared").get_items()) == [user("hello")]


def test_session_ids_map_to_respawn_sessions():
    known = "0d6c3f0e-1c55-4c3e-9a4e-2d1f0b7f5a10"
    assert str(session_id_for(known)) == known
    assert session_id_for("ticket-42") == session_id_for("ticket-42")
    assert session_id_for("ticket-42") != session_id_for("ticket-43")
    with pytest.raises(ValueError, match="non-empty string"):
        session_id_for("")


def test_concurrent_pops_return_each_item_once(make_session):
    seed = make_session("conv-race")
    run(seed.add_items([user(f"item {n}") for n in range(40)]))
    popped: list = []
    lock = threading.Lock()

    def pop_all():
        session = RespawnSession("conv-race")
        try:
            while (item := session.pop_item_sync()) is not None:
                with lock:
                    popped.append(item["content"])
        finally:
            session.close()
            connections.close_all()  # the *_sync calls used this thread's own connection

    threads = [threading.Thread(target=pop_all) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(popped) == sorted(f"item {n}" for n in range(40))
    assert len(popped) == 40


def test_items_are_steps_the_trace_shows_masked_and_come_back_exactly(make_session, client, users):
    session = make_session("conv-trace")
    secret = "sk-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4"
    run(
        session.add_items(
            [
                user(f"my key is {secret}"),
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "lookup",
                    "arguments": '{"order": "O-7"}',
                },
                {"type": "function_call_output", "call_id": "c1", "output": "shipped"},
                assistant("It shipped."),
            ]
        )
    )
    steps = list(Step.objects.filter(session_id=session.respawn_id).order_by("seq"))
    assert [s.kind for s in steps] == ["user", "tool_call", "tool_result", "model"]
    assert steps[1].payload["arguments"] == {"order": "O-7"}
    assert steps[2].payload["name"] == "lookup"
    # Stored sealed: people see the masked item, the run reads it back exactly.
    assert secret not in str(steps[0].payload)
    assert run(session.get_items())[0] == user(f"my key is {secret}")
    row = AgentSession.objects.get(id=session.respawn_id)
    assert row.final_answer == "It shipped." and row.status == "completed"
    # A consistent point (every call answered) is a checkpoint: a rollback or fork target.
    assert Checkpoint.objects.filter(session=row, seq=4).exists()
    client.force_login(users["viewer"])
    page = client.get(f"/sessions/{row.id}/").content.decode()
    assert "It shipped." in page and "lookup" in page and secret not in page


def test_a_runner_conversation_over_three_turns(make_session, sdk_model):
    from acme_sdk import run_config, support

    session = make_session("conv-runner", agent="acme-sdk")
    answers = []
    for text in ("hello", "how are you", "bye"):
        result = run(Runner.run(support, text, session=session, run_config=run_config))
        answers.append(result.final_output)
    assert answers == [
        "You said: hello (turn 1, saw 2 messages)",
        "You said: how are you (turn 2, saw 4 messages)",
        "You said: bye (turn 3, saw 6 messages)",
    ]
    # The third request carried the whole conversation, from the session.
    assert [m["role"] for m in sent_messages(sdk_model)] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    steps = Step.objects.filter(session_id=session.respawn_id).order_by("seq")
    assert [s.kind for s in steps] == ["user", "model"] * 3
    row = AgentSession.objects.get(id=session.respawn_id)
    assert row.agent == "acme-sdk" and row.status == "completed"
    assert row.final_answer == answers[-1]


def test_a_runner_with_tools_stores_calls_with_their_outputs(make_session, sdk_model):
    from acme_sdk import run_config, support

    session = make_session("conv-tools")
    result = run(Runner.run(support, "loop 2", session=session, run_config=run_config))
    assert result.final_output == "Worked 2 steps."
    kinds = list(
        Step.objects.filter(session_id=session.respawn_id)
        .order_by("seq")
        .values_list("kind", flat=True)
    )
    assert kinds == ["user", "tool_call", "tool_result", "tool_call", "tool_result", "model"]
    items = run(session.get_items())
    assert [i.get("type", "message") for i in items] == [
        "message",
        "function_call",
        "function_call_output",
        "function_call",
        "function_call_output",
        "message",
    ]


def test_a_program_cannot_write_a_session_a_worker_runs(make_session):
    session = make_session("conv-busy")
    run(session.add_items([user("hi")]))
    AgentSession.objects.filter(id=session.respawn_id).update(status="queued")
    with pytest.raises(SessionBusy, match="nothing was written"):
        run(session.add_items([user("again")]))
    assert run(session.get_items()) == [user("hi")]


def test_sync_methods_for_code_that_is_not_async(make_session):
    session = make_session("conv-sync")
    session.add_items_sync([user("a"), user("b")])
    assert session.get_items_sync(limit=1) == [user("b")]
    assert session.pop_item_sync() == user("b")
    session.clear_session_sync()
    assert session.get_items_sync() == []


def test_an_sdk_conversation_is_found_by_the_dashboards_search(make_session, client, users):
    from django.urls import reverse

    from sessions_app.upkeep import search

    session = make_session("conv-search")
    run(session.add_items([user("my platypus is missing"), assistant("Let me look for it.")]))
    other = make_session("conv-other")
    run(other.add_items([user("nothing to see")]))
    search.index_pending()
    client.force_login(users["viewer"])
    page = client.get(reverse("sessions:list"), {"q": "platypus"})
    assert [s.id for s in page.context["sessions"]] == [session.respawn_id]


def test_session_settings_limit_what_a_run_reads(make_session, sdk_model):
    from acme_sdk import run_config, support
    from agents.memory import SessionSettings

    session = make_session("conv-settings", session_settings=SessionSettings(limit=2))
    for text in ("one", "two", "three"):
        run(Runner.run(support, text, session=session, run_config=run_config))
    # The third run read the latest 2 items (the second turn) before its own input.
    assert [m["role"] for m in sent_messages(sdk_model)] == ["system", "user", "assistant", "user"]
    assert len(run(session.get_items(limit=100))) == 6  # all kept
    assert len(run(session.get_items())) == 2  # the settings' limit, as SQLiteSession's


def test_a_streamed_run_stores_its_items_too(make_session, sdk_model):
    from acme_sdk import run_config, support

    session = make_session("conv-streamed")

    async def streamed():
        result = Runner.run_streamed(support, "loop 1", session=session, run_config=run_config)
        async for _event in result.stream_events():
            pass
        return result.final_output

    assert run(streamed()) == "Worked 1 steps."
    items = run(session.get_items())
    assert [i.get("type", "message") for i in items] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]


def test_a_tool_call_is_in_the_trace_while_it_runs(make_session, sdk_model):
    """With the session's trace hooks (the workers' runs pass them), the dashboard sees a
    tool call as it starts, before the turn's items are written, and its end."""
    from acme_sdk import run_config, support
    from agents import function_tool

    session = make_session("conv-live-tools")
    seen: list[list[tuple[str, dict]]] = []

    def committed() -> None:  # another connection: what the dashboard would read now
        rows = Step.objects.filter(session_id=session.respawn_id).order_by("seq")
        seen.append([(r.kind, r.payload) for r in rows])
        connections.close_all()

    @function_tool
    def work(step: int) -> str:
        """Do one step of work."""
        reader = threading.Thread(target=committed)
        reader.start()
        reader.join()
        return f"step {step} done"

    agent = support.clone(tools=[work])
    result = run(
        Runner.run(
            agent, "loop 1", session=session, run_config=run_config, hooks=session.trace_hooks()
        )
    )
    assert result.final_output == "Worked 1 steps."
    (during,) = seen
    started = [p for k, p in during if k == "system" and p.get("event") == "sdk_tool_started"]
    assert len(started) == 1
    assert started[0]["tool"] == "work" and started[0]["arguments"] == {"step": 1}
    assert started[0]["call_id"]
    assert "tool_call" not in [k for k, _ in during]  # the items come at the turn's end
    finished = Step.objects.get(session_id=session.respawn_id, payload__event="sdk_tool_finished")
    assert finished.payload["call_id"] == started[0]["call_id"]
    assert finished.payload["output"] == "step 1 done"
    # The hooks' steps are the trace's, not the conversation's: the items are unchanged.
    items = run(session.get_items())
    assert [i.get("type", "message") for i in items] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]


def test_a_checkpoint_with_a_secret_is_sealed_whole_with_its_agent_and_step_count(make_session):
    """A state that shows a secret is stored sealed: its exact copy (what a run reads back)
    holds the agent and step count as its masked view does, on every write, the first (the
    session created) and those after (one statement when nothing is sealed)."""
    from sessions_app.sealing import exact

    secret = "sk-proj-FAKEfakeFAKEfake0123456789abcdefgh"
    session = make_session("conv-sealed")
    run(session.add_items([user("hi"), assistant(f"the key is {secret}")]))
    run(session.add_items([user("and again?"), assistant(f"still {secret}")]))
    run(session.add_items([user("thanks"), assistant("you are welcome")]))
    row = AgentSession.objects.get(id=session.respawn_id)
    checkpoints = list(Checkpoint.objects.filter(session=row).order_by("seq"))
    assert [c.seq for c in checkpoints] == [2, 4, 6]
    for checkpoint in checkpoints:
        whole = exact(checkpoint.state)
        assert whole["agent"] == checkpoint.state["agent"] == {"name": row.agent, "version": ""}
        assert whole["counters"] == checkpoint.state["counters"]
        assert whole["counters"]["steps"] == checkpoint.seq
    sealed = [exact(c.state)["final_answer"] for c in checkpoints[:2]]
    assert sealed == [f"the key is {secret}", f"still {secret}"]
    assert secret not in str([c.state for c in checkpoints])  # the views are masked
