"""The incremental conversation equals build_messages over the same steps; tool threads."""

from __future__ import annotations

import threading
import time

from agent_runtime.loop import Conversation, build_messages
from agent_runtime.state import StepKind, StepRecord, instruction_payload
from agent_runtime.store import InMemoryStore
from agent_runtime.tools import ToolContext, tool

from .helpers import new_session, run

DEMO_TASK = "what is (12*7)+3, then save it as a note"


def _operator(seq: int, payload: dict) -> StepRecord:
    return StepRecord(seq=seq, kind=StepKind.OPERATOR, payload=payload)


def test_conversation_built_step_by_step_equals_build_messages_at_every_prefix():
    store = InMemoryStore()
    session_id = new_session(store, "demo", DEMO_TASK)
    run(store, session_id)
    history = list(store.load_head(session_id).history)
    result_seq = next(s.seq for s in history if s.kind == StepKind.TOOL_RESULT)
    n = history[-1].seq
    history += [
        # A correction changes how an earlier step renders: the conversation rebuilds.
        _operator(
            n + 1,
            {
                "action": "correct_result",
                "result_seq": result_seq,
                "call_id": "call_0_0",
                "output": {"fixed": True},
                "actor": "alice",
                "note": "typo",
            },
        ),
        _operator(n + 2, instruction_payload("be brief", "alice")),
    ]
    conversation = Conversation("sys", history[:1])
    for index in range(1, len(history) + 1):
        if index > 1:
            conversation.add(history[index - 1])
        assert conversation.messages == build_messages("sys", history[:index]), index


def test_conversation_answers_abandoned_calls_like_build_messages():
    history = [
        StepRecord(
            seq=1, kind=StepKind.USER, payload={"content": [{"type": "text", "text": "pay"}]}
        ),
        StepRecord(
            seq=2,
            kind=StepKind.MODEL,
            payload={
                "content": [],
                "tool_calls": [{"id": "c1", "name": "send_payment", "arguments": {}}],
            },
        ),
    ]
    conversation = Conversation("", history)
    conversation.add(_operator(3, instruction_payload("stop", "bob")))
    messages = conversation.messages
    assert [m.role for m in messages] == ["user", "assistant", "tool", "user"]
    assert messages == build_messages(
        "", [*history, _operator(3, instruction_payload("stop", "bob"))]
    )


def test_a_tool_that_overruns_does_not_hold_up_the_next_call():
    release = threading.Event()

    @tool(timeout=0.2)
    def stuck(ctx: ToolContext) -> dict:
        """Blocks until released."""
        release.wait(10)
        return {}

    @tool(timeout=5)
    def quick(ctx: ToolContext) -> dict:
        """Returns at once."""
        return {"ok": True}

    def ctx(attempt: int) -> ToolContext:
        return ToolContext(
            session_id="s",
            call_id="c",
            seq=1,
            idempotency_key="k",
            attempt=attempt,
            effects=None,
            options={},
        )

    try:
        assert "timed out" in stuck.run(ctx, {}).error
        started = time.monotonic()
        outcomes = [quick.run(ctx, {}) for _ in range(3)]
        assert all(o.ok for o in outcomes)
        assert time.monotonic() - started < 2
    finally:
        release.set()


def test_a_resumed_run_starts_from_the_tail_and_loads_the_conversation_for_the_model():
    """After a crash, the next run's first step is written from the tail alone; the whole
    conversation is read once, when the model is called, and is exactly build_messages
    over the live history at that moment."""
    from agent_runtime.loop import Outcome
    from agent_runtime.providers import make_provider
    from demo_agents import demo_agents

    from .helpers import Crash, CrashingStore

    class SpyStore(InMemoryStore):
        events: list[str] = []

        def append(self, lease, steps, **kwargs):
            self.events.append("append")
            return super().append(lease, steps, **kwargs)

        def load_history(self, session_id):
            self.events.append("load_history")
            return super().load_history(session_id)

    store = SpyStore()
    agents = demo_agents(slow_delay=0)
    sid = new_session(store, "demo", "what is (12*7)+3, then save it as a note")
    try:  # dies in the second turn, after its model step and tool call were committed
        run(CrashingStore(store, at_seq=7, after_commit=True), sid, agents=agents)
    except Crash:
        pass
    store.expire_lease(sid)
    tail = store.load_tail(sid)
    assert tail.history_from > 1 and len(tail.history) < len(store.load_head(sid).history)

    seen: list[tuple[list, list]] = []

    def spying_provider(spec, options):
        provider, name = make_provider(spec, options)

        class Spy:
            def complete(self, messages, tools, settings):
                live = store.load_head(sid).history
                seen.append((list(messages), build_messages(agents.get("demo").instructions, live)))
                return provider.complete(messages, tools, settings)

        return Spy(), name

    store.events.clear()
    result = run(store, sid, agents=agents, make_provider=spying_provider)
    assert result.outcome == Outcome.COMPLETED
    assert store.events[0] == "append"  # run_started, before any history is read
    assert store.events.count("load_history") == 1
    assert seen and all(given == expected for given, expected in seen)
