"""The loop on the in-memory store: no database, no network."""

from __future__ import annotations

import pytest

from agent_runtime.agents import Agent, AgentRegistry, Limits
from agent_runtime.loop import Outcome, build_messages
from agent_runtime.providers import ModelTurn, ProviderError, ToolCall
from agent_runtime.state import NewStep, SessionStatus, StepKind, instruction_payload, step_text
from agent_runtime.store import InMemoryEffects, InMemoryStore
from agent_runtime.tools import ToolContext, tool
from demo_agents import demo_agents

from .helpers import CountingStore, Crash, CrashingStore, conversation, new_session, run

DEMO_TASK = "what is (12*7)+3, then save it as a note"


def kinds(store, session_id):
    return [str(s.kind) for s in store.session(session_id).steps]


def test_demo_run_gives_expected_steps_and_answer():
    store = InMemoryStore()
    effects = InMemoryEffects()
    session_id = new_session(store, "demo", DEMO_TASK)

    result = run(store, session_id, effects)

    assert result.outcome == Outcome.COMPLETED
    assert result.final_answer == f"(12*7)+3 = 87. Saved as note note-{session_id}-call_1_1."
    assert kinds(store, session_id) == [
        "user",
        "system",
        "model",
        "tool_call",
        "tool_result",
        "tool_call",
        "tool_result",
        "model",
        "tool_call",
        "tool_result",
        "tool_call",
        "tool_result",
        "model",
    ]
    steps = store.session(session_id).steps
    assert [s.seq for s in steps] == list(range(1, 14))
    calc = steps[6].payload
    assert calc["name"] == "calculator" and calc["output"]["value"] == 87
    session = store.session(session_id)
    assert session.status == SessionStatus.COMPLETED
    assert session.lease_owner is None
    # One checkpoint per turn boundary: after each turn's last result, and the answer.
    assert [c.seq for c in session.checkpoints] == [7, 12, 13]
    state = session.checkpoints[-1].state
    assert state.final_answer == result.final_answer
    assert [p.status for p in state.plan] == ["done", "in_progress", "pending"]
    assert [p.id for p in state.plan] == ["p1", "p2", "p3"]  # kept across the plan update
    assert state.memory_refs == [f"note-{session_id}-call_1_1"]
    assert state.counters.model_calls == 3 and state.counters.tool_calls == 4
    assert state.counters.steps == 13
    # The note was written once, under the tool call's idempotency key (session, seq).
    assert list(effects.rows) == [f"{session_id}:11"]


def test_run_records_what_it_loaded():
    store = InMemoryStore()
    session_id = new_session(store, "echo", "hello")
    run(store, session_id)
    system = store.session(session_id).steps[1]
    assert system.kind == StepKind.SYSTEM
    assert system.payload["event"] == "run_started"
    assert system.payload["checkpoint_seq"] is None
    assert system.payload["steps_after_checkpoint"] == 1


@pytest.mark.parametrize("after_commit", [False, True], ids=["before-commit", "after-commit"])
def test_crash_at_any_append_resumes_to_the_same_trace(after_commit):
    """Kill the run at every write in turn; each resumed run ends in the uninterrupted trace."""
    reference_store = InMemoryStore()
    reference = new_session(reference_store, "demo", DEMO_TASK)
    counting = CountingStore(reference_store)
    run(reference_store, counting, reference)
    expected = conversation(reference_store, reference)
    total_appends = counting.appends  # every write of the run but the user's first step
    # The model's answer and the call it runs next are one commit, its result another
    # (each of the demo's two turns runs two calls in a row: the second is recorded on
    # its own): run_started, 4 per turn, the answer.
    assert total_appends == 10 and len(reference_store.session(reference).steps) == 13

    for crash_at in range(1, total_appends + 1):
        store = InMemoryStore()
        effects = InMemoryEffects()
        session_id = new_session(store, "demo", DEMO_TASK)
        with pytest.raises(Crash):
            run(store, CrashingStore(store, crash_at, after_commit), session_id, effects)
        store.expire_lease(session_id)
        if store.session(session_id).status == SessionStatus.COMPLETED:
            # Died after the final commit: the answer and the status were one transaction.
            assert crash_at == total_appends and after_commit
        else:
            result = run(store, session_id, effects, worker="w2")
            assert result.outcome == Outcome.COMPLETED, crash_at
        assert store.session(session_id).status == SessionStatus.COMPLETED
        assert conversation(store, session_id) == expected, crash_at
        seqs = [s.seq for s in store.session(session_id).steps]
        assert seqs == list(range(1, len(seqs) + 1))
        # The note tool honours its key: its effect exists once, whatever was re-run.
        assert len(effects.rows) == 1, crash_at


def test_a_turn_is_two_commits():
    """The model's answer and the call it asks for are one commit; the call's result, with
    the turn's checkpoint, the other."""
    store = InMemoryStore()
    session_id = new_session(store, "slow", "count to 3")
    counting = CountingStore(store)
    assert run(store, counting, session_id).outcome == Outcome.COMPLETED
    assert counting.kinds == [
        ["system"],
        *[["model", "tool_call"], ["tool_result"]] * 3,
        ["model"],
    ]
    steps = store.session(session_id).steps
    calls = [s for s in steps if s.kind == StepKind.TOOL_CALL]
    # Each call's seq and key are the ones it had when recorded in a commit of its own.
    assert [c.seq for c in calls] == [4, 7, 10]
    assert [c.idempotency_key for c in calls] == [f"{session_id}:{c.seq}" for c in calls]
    assert [c.seq for c in store.session(session_id).checkpoints] == [5, 8, 11, 12]


def test_a_call_that_waits_for_approval_is_not_recorded_with_the_answer():
    """Recorded only once a person approved it, just before it runs."""
    store, effects = InMemoryStore(), InMemoryEffects()
    session_id = new_session(store, "approval", "pay invoice 7")
    counting = CountingStore(store)
    assert run(store, counting, session_id, effects).outcome == Outcome.WAITING_INPUT
    assert counting.kinds == [["system"], ["model"], ["system"]]
    store.add_operator_step(
        session_id,
        {"action": "approve", "call_id": "call_0_0", "actor": "alice"},
        status=SessionStatus.QUEUED,
    )
    counting = CountingStore(store)
    assert run(store, counting, session_id, effects).outcome == Outcome.COMPLETED
    assert counting.kinds[:3] == [["system"], ["tool_call"], ["tool_result"]]


def run(store, session_or_crashing, *args, **kwargs):  # noqa: F811 - the crash-aware runner
    from .helpers import run as plain_run

    if isinstance(session_or_crashing, CrashingStore | CountingStore):
        crashing, session_id = session_or_crashing, args[0]
        return plain_run(crashing, session_id, *args[1:], **kwargs)
    return plain_run(store, session_or_crashing, *args, **kwargs)


def test_tool_that_raises_becomes_a_result_the_model_sees():
    @tool
    def explode(ctx: ToolContext, n: int) -> dict:
        """Always fails."""
        raise RuntimeError("disk on fire")

    class Model:
        def complete(self, messages, tools, settings):
            if messages[-1].role == "tool":
                return ModelTurn(text=f"tool said: {messages[-1].content}")
            return ModelTurn(text=None, tool_calls=[ToolCall("c1", "explode", {"n": 1})])

    agents = AgentRegistry([Agent(name="boom", model="scripted:echo", tools=[explode])])
    store = InMemoryStore()
    session_id = new_session(store, "boom", "go")
    result = run(store, session_id, agents=agents, make_provider=lambda spec, opts: (Model(), "m"))
    assert result.outcome == Outcome.COMPLETED
    tool_result = store.session(session_id).steps[4]
    assert tool_result.kind == StepKind.TOOL_RESULT
    assert tool_result.payload["status"] == "error"
    assert "RuntimeError: disk on fire" in tool_result.payload["error"]
    assert "disk on fire" in result.final_answer


def test_invalid_arguments_and_unknown_tools_are_results_not_crashes():
    class Model:
        def complete(self, messages, tools, settings):
            if messages[-1].role == "tool":
                return ModelTurn(text="done")
            return ModelTurn(
                text=None,
                tool_calls=[
                    ToolCall("c1", "calculator", {"expression": 12}),
                    ToolCall("c2", "no_such_tool", {}),
                ],
            )

    store = InMemoryStore()
    session_id = new_session(store, "demo", "go")
    result = run(store, session_id, make_provider=lambda spec, opts: (Model(), "m"))
    assert result.outcome == Outcome.COMPLETED
    results = [s.payload for s in store.session(session_id).steps if s.kind == StepKind.TOOL_RESULT]
    assert results[0]["status"] == "error"
    assert "invalid arguments for calculator" in results[0]["error"]
    assert "expression" in results[0]["error"]
    assert results[1]["status"] == "error"
    assert "unknown tool 'no_such_tool'" in results[1]["error"]


def test_flaky_tool_is_retried_until_it_succeeds():
    store = InMemoryStore()
    session_id = new_session(store, "flaky", "status please")
    result = run(store, session_id)
    assert result.outcome == Outcome.COMPLETED
    assert result.final_answer == "Status: all systems nominal (after 3 attempts)."
    state = store.session(session_id).checkpoints[-1].state
    assert state.counters.retries == 2


def test_provider_errors_are_retried_then_fail_the_session_resumably():
    calls = []

    class Down:
        def complete(self, messages, tools, settings):
            calls.append(1)
            raise ProviderError("503 overloaded")

    store = InMemoryStore()
    session_id = new_session(store, "echo", "hi")
    result = run(
        store, session_id, make_provider=lambda s, o: (Down(), "m"), config={"model_retries": 2}
    )
    assert result.outcome == Outcome.FAILED
    assert len(calls) == 3
    session = store.session(session_id)
    assert session.status == SessionStatus.FAILED
    assert "503 overloaded" in session.last_error
    error = session.steps[-1]
    assert error.kind == StepKind.ERROR and error.payload["attempts"] == 3
    # Resumable later: queue it again and a working model finishes it.
    session.status = SessionStatus.QUEUED
    assert run(store, session_id).outcome == Outcome.COMPLETED
    assert step_text(store.session(session_id).steps[-1].payload) == "You said: hi"


def test_permanent_provider_error_is_not_retried():
    calls = []

    class BadKey:
        def complete(self, messages, tools, settings):
            calls.append(1)
            raise ProviderError("401 invalid key", permanent=True, status=401)

    store = InMemoryStore()
    session_id = new_session(store, "echo", "hi")
    result = run(store, session_id, make_provider=lambda s, o: (BadKey(), "m"))
    assert result.outcome == Outcome.FAILED and len(calls) == 1
    assert store.session(session_id).steps[-1].payload["permanent"] is True


def test_step_limit_pauses_the_session():
    agents = demo_agents(slow_delay=0)
    slow = agents.get("slow")
    limited = AgentRegistry(
        [Agent(name="slow", model=slow.model, tools=slow.tools, limits=Limits(max_steps=6))]
    )
    store = InMemoryStore()
    session_id = new_session(store, "slow", "count to 50")
    result = run(store, session_id, agents=limited)
    assert result.outcome == Outcome.PAUSED
    assert store.session(session_id).status == SessionStatus.PAUSED
    assert "step limit of 6 reached" in store.session(session_id).last_error


def test_approval_pauses_then_approve_runs_the_tool():
    store = InMemoryStore()
    effects = InMemoryEffects()
    session_id = new_session(store, "approval", "pay invoice 7")
    assert run(store, session_id, effects).outcome == Outcome.WAITING_INPUT
    session = store.session(session_id)
    assert session.status == SessionStatus.WAITING_INPUT
    pending = session.checkpoints[-1].state.pending_approval
    assert pending.tool == "send_payment" and pending.call_id == "call_0_0"
    assert effects.rows == {}  # nothing ran before the decision

    store.add_operator_step(
        session_id,
        {"action": "approve", "call_id": "call_0_0", "actor": "alice"},
        status=SessionStatus.QUEUED,
    )
    result = run(store, session_id, effects)
    assert result.outcome == Outcome.COMPLETED
    assert result.final_answer.startswith("Payment sent")
    assert len(effects.rows) == 1
    assert store.session(session_id).checkpoints[-1].state.pending_approval is None


def test_reject_gives_the_model_an_error_result_and_nothing_runs():
    store = InMemoryStore()
    effects = InMemoryEffects()
    session_id = new_session(store, "approval", "pay invoice 7")
    run(store, session_id, effects)
    store.add_operator_step(
        session_id,
        {"action": "reject", "call_id": "call_0_0", "actor": "bob", "reason": "duplicate invoice"},
        status=SessionStatus.QUEUED,
    )
    result = run(store, session_id, effects)
    assert result.outcome == Outcome.COMPLETED
    assert result.final_answer == "Payment not sent: rejected by bob: duplicate invoice"
    assert effects.rows == {}


def test_cancel_request_stops_the_run_at_the_next_step():
    store = InMemoryStore()
    session_id = new_session(store, "slow", "count to 100")

    class CancelAfterThree:
        def __init__(self):
            self.calls = 0

        def complete(self, messages, tools, settings):
            from demo_agents.scripts import slow

            self.calls += 1
            if self.calls == 3:
                store.request_cancel(session_id)
            return slow(messages)

    model = CancelAfterThree()
    result = run(store, session_id, make_provider=lambda s, o: (model, "m"))
    assert result.outcome == Outcome.CANCELLED
    session = store.session(session_id)
    assert session.status == SessionStatus.CANCELLED
    assert session.steps[-1].payload["event"] == "cancelled"
    assert model.calls == 3


def test_fenced_off_worker_stops_without_writing():
    store = InMemoryStore()
    session_id = new_session(store, "slow", "count to 5")

    class TakeOver:
        calls = 0

        def complete(self, messages, tools, settings):
            from demo_agents.scripts import slow

            TakeOver.calls += 1
            if TakeOver.calls == 2:
                # Another worker takes the session over while this one "pauses".
                store.expire_lease(session_id)
                assert store.claim(session_id, "intruder", ttl=30) is not None
            return slow(messages)

    before = None
    result = run(store, session_id, make_provider=lambda s, o: (TakeOver(), "m"))
    assert result.outcome == Outcome.LEASE_LOST
    steps = store.session(session_id).steps
    before = len(steps)
    # Nothing after the takeover: the second model turn was never written.
    assert [str(s.kind) for s in steps] == ["user", "system", "model", "tool_call", "tool_result"]
    assert before == 5


def test_second_claim_of_a_leased_session_gets_nothing():
    store = InMemoryStore()
    session_id = new_session(store, "echo", "hi")
    assert store.claim(session_id, "a", ttl=30) is not None
    result = run(store, session_id, worker="b")
    assert result.outcome == Outcome.NOT_CLAIMED
    assert len(store.session(session_id).steps) == 1


def test_messages_are_rebuilt_from_steps_the_same_after_resume():
    store = InMemoryStore()
    session_id = new_session(store, "demo", DEMO_TASK)
    run(store, session_id)
    history = store.load_head(session_id).history
    messages = build_messages("sys", history)
    assert [m.role for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]
    assert messages[3].tool_call_id == "call_0_0"


def test_operator_instruction_is_marked_as_operator_in_messages():
    store = InMemoryStore()
    session_id = new_session(store, "echo", "hi")
    run(store, session_id)
    store.add_operator_step(
        session_id, instruction_payload("be brief", "alice"), status=SessionStatus.QUEUED
    )
    messages = build_messages("", store.load_head(session_id).history)
    assert messages[-1].role == "user"
    assert messages[-1].content == "[Operator instruction] be brief"


def test_heartbeat_keeps_the_lease_while_a_tool_outlives_the_ttl():
    """A tick that takes three lease TTLs: nobody can claim the session meanwhile."""
    import threading

    store = InMemoryStore()
    session_id = new_session(store, "slow", "count to 1")
    stolen = []

    def try_to_steal():
        while store.session(session_id).lease_owner != "w1":  # wait until the run holds it
            threading.Event().wait(0.005)
        while not stolen and store.session(session_id).status != SessionStatus.COMPLETED:
            lease = store.claim(session_id, "thief", ttl=30)
            if lease is not None:
                stolen.append(lease)
            threading.Event().wait(0.02)

    thief = threading.Thread(target=try_to_steal)
    thief.start()
    result = run(
        store,
        session_id,
        agents=demo_agents(slow_delay=0.9),
        config={"lease_ttl": 0.3, "heartbeat_interval": 0.05},
    )
    thief.join()
    assert result.outcome == Outcome.COMPLETED
    assert stolen == []


def test_calls_left_without_result_are_answered_before_new_input():
    from agent_runtime.state import StepRecord

    history = [
        StepRecord(seq=1, kind=StepKind.USER, payload={"text": "pay"}),
        StepRecord(
            seq=2,
            kind=StepKind.MODEL,
            payload={
                "text": None,
                "tool_calls": [{"id": "c1", "name": "send_payment", "arguments": {}}],
            },
        ),
        StepRecord(
            seq=3, kind=StepKind.OPERATOR, payload={"action": "instruction", "text": "stop"}
        ),
    ]
    messages = build_messages("", history)
    assert [m.role for m in messages] == ["user", "assistant", "tool", "user"]
    assert messages[2].tool_call_id == "c1" and "not run" in messages[2].content


def test_secrets_in_unexpected_provider_errors_are_redacted():
    class Leaky:
        def complete(self, messages, tools, settings):
            raise RuntimeError("bad auth for sk-live-0123456789abcdef")

    store = InMemoryStore()
    session_id = new_session(store, "echo", "hi")
    run(
        store,
        session_id,
        make_provider=lambda s, o: (Leaky(), "m"),
        config={
            "model_retries": 0,
            "provider_options": {"openai_api_key": "sk-live-0123456789abcdef"},
        },
    )
    session = store.session(session_id)
    assert "sk-live" not in session.last_error and "[redacted]" in session.last_error
    assert all("sk-live" not in str(s.payload) for s in session.steps)


def _crash_inside_notify(store, effects):
    """A notify session whose worker died between the tool call and its result."""
    session_id = new_session(store, "notify", "deploy finished")
    with pytest.raises(Crash):
        # The result's write (seq 5: the user, run_started, the model's answer, the call).
        run(store, CrashingStore(store, at_seq=5), session_id, effects)
    store.expire_lease(session_id)
    return session_id


def test_non_idempotent_call_left_without_result_waits_for_a_person():
    store, effects = InMemoryStore(), InMemoryEffects()
    session_id = _crash_inside_notify(store, effects)
    assert len(effects.rows) == 1  # it did go out before the crash; nobody can tell
    result = run(store, session_id, effects, worker="w2")
    assert result.outcome == Outcome.WAITING_INPUT
    session = store.session(session_id)
    marker = session.steps[-1]
    assert (
        marker.payload["event"] == "uncertain_call"
        and marker.payload["tool"] == "send_notification"
    )
    assert session.checkpoints[-1].state.uncertain_calls == [marker.payload["call_id"]]
    assert effects.attempts[next(iter(effects.rows))] == 1  # not run again on its own


def test_uncertain_call_recorded_by_hand_continues_without_running_it():
    store, effects = InMemoryStore(), InMemoryEffects()
    session_id = _crash_inside_notify(store, effects)
    run(store, session_id, effects, worker="w2")
    call_id = store.session(session_id).checkpoints[-1].state.uncertain_calls[0]
    store.add_operator_step(
        session_id,
        {
            "action": "record_result",
            "call_id": call_id,
            "actor": "olivia",
            "output": {"message_id": "msg-42"},
        },
        status=SessionStatus.QUEUED,
    )
    result = run(store, session_id, effects, worker="w3")
    assert result.outcome == Outcome.COMPLETED
    assert result.final_answer == "Notification sent: msg-42."
    recorded = [s for s in store.session(session_id).steps if s.kind == StepKind.TOOL_RESULT][-1]
    assert recorded.payload["recorded_by_operator"] == "olivia"
    assert effects.attempts[next(iter(effects.rows))] == 1
    assert store.session(session_id).checkpoints[-1].state.uncertain_calls == []


def test_uncertain_call_rerun_runs_it_again_with_the_same_key():
    store, effects = InMemoryStore(), InMemoryEffects()
    session_id = _crash_inside_notify(store, effects)
    run(store, session_id, effects, worker="w2")
    call_id = store.session(session_id).checkpoints[-1].state.uncertain_calls[0]
    store.add_operator_step(
        session_id,
        {"action": "rerun", "call_id": call_id, "actor": "olivia"},
        status=SessionStatus.QUEUED,
    )
    result = run(store, session_id, effects, worker="w3")
    assert result.outcome == Outcome.COMPLETED and result.final_answer.startswith(
        "Notification sent"
    )
    key = next(iter(effects.rows))
    assert effects.attempts[key] == 2 and len(effects.rows) == 1


def test_idempotent_tools_are_simply_run_again_after_a_crash():
    store, effects = InMemoryStore(), InMemoryEffects()
    session_id = new_session(store, "slow", "count to 2")
    with pytest.raises(Crash):
        run(store, CrashingStore(store, at_seq=5), session_id, effects)  # the first result
    store.expire_lease(session_id)
    assert run(store, session_id, effects, worker="w2").outcome == Outcome.COMPLETED


def test_poison_session_fails_after_repeated_crashes_at_the_same_step():
    store = InMemoryStore()
    session_id = new_session(store, "slow", "count to 3")
    lease = store.claim(session_id, "w1", ttl=30)
    # Workers in a row die before writing anything but their run_started step.
    for worker in ("w2", "w3"):
        store.expire_lease(session_id)
        lease = store.claim(session_id, worker, ttl=30)
        store.append(lease, [NewStep(kind=StepKind.SYSTEM, payload={"event": "run_started"})])
    assert lease.crashes == 2
    store.expire_lease(session_id)
    result = run(store, session_id, worker="w4", config={"max_crashes": 3})
    assert result.outcome == Outcome.FAILED
    assert "died 3 times in a row" in store.session(session_id).last_error
    assert store.session(session_id).steps[-1].payload["crashes"] == 3


def test_crashes_with_progress_in_between_do_not_count_as_poison():
    store = InMemoryStore()
    session_id = new_session(store, "slow", "count to 6")
    for crash_at in (2, 2, 2):
        with pytest.raises(Crash):
            run(
                store,
                CrashingStore(store, crash_at=crash_at, after_commit=True),
                session_id,
                worker="w",
            )
        store.expire_lease(session_id)
    assert (
        run(store, session_id, worker="w9", config={"max_crashes": 2}).outcome == Outcome.COMPLETED
    )
