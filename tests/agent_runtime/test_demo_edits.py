"""The demo model answers an operator's edits so that they can be seen taking effect."""

from __future__ import annotations

from agent_runtime.store import InMemoryStore
from tests.agent_runtime.helpers import new_session, run


def answer(store, session_id):
    return store.load_head(session_id).checkpoint.state.final_answer


def test_a_corrected_result_is_answered_from_the_correction():
    store = InMemoryStore()
    session_id = new_session(store, "demo", "what is (12*7)+3")
    run(store, session_id)
    assert answer(store, session_id) == "(12*7)+3 = 87."
    result = next(
        s
        for s in store.session(session_id).steps
        if s.kind == "tool_result" and s.payload["name"] == "calculator"
    )
    store.add_operator_step(
        session_id,
        {
            "action": "correct_result",
            "actor": "olivia",
            "result_seq": result.seq,
            "call_id": result.payload["call_id"],
            "output": {"value": 88},
            "note": "the meter was off by one",
        },
        status="queued",
    )
    assert run(store, session_id).outcome == "completed"
    assert answer(store, session_id) == (
        "With the corrected result from olivia (the meter was off by one): (12*7)+3 = 88."
    )


def test_an_instruction_is_followed_and_says_so():
    store = InMemoryStore()
    session_id = new_session(store, "demo", "what is (12*7)+3, then save it as a note")
    run(store, session_id)
    store.add_operator_step(
        session_id,
        {
            "action": "instruction",
            "actor": "olivia",
            "content": [{"type": "text", "text": "be brief"}],
        },
        status="queued",
    )
    run(store, session_id)
    assert answer(store, session_id) == "(brief, as instructed) (12*7)+3 = 87."
    store.add_operator_step(
        session_id,
        {
            "action": "instruction",
            "actor": "olivia",
            "content": [{"type": "text", "text": "mention the ticket #42"}],
        },
        status="queued",
    )
    run(store, session_id)
    assert (
        answer(store, session_id) == "Following the operator's instruction: mention the ticket #42"
    )
