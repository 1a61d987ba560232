"""RespawnSaver keeps what a graph gives it: values round-trip exactly (or are refused
with a clear error, never changed), and building a saver draws nothing from `uuid.uuid4`
(LangGraph's own tests patch it to a fixed sequence)."""

from __future__ import annotations

import uuid
from typing import TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

from sessions_app.langgraph.saver import RespawnSaver

pytestmark = pytest.mark.django_db(transaction=True)


def test_building_a_saver_draws_no_uuid4(monkeypatch, make_saver):
    def refuse() -> uuid.UUID:
        raise AssertionError("RespawnSaver() drew a uuid4")

    monkeypatch.setattr(uuid, "uuid4", refuse)
    first, second = make_saver(), make_saver()
    # Still a lease owner of its own per saver.
    assert first._owner != second._owner
    assert first._owner.startswith("langgraph:")


class _Text(TypedDict):
    text: str
    note: str


def _text_graph(saver: RespawnSaver):
    def node(state: _Text) -> dict:
        return {"note": state["text"] + "\x00end"}

    graph = StateGraph(_Text)
    graph.add_node("node", node)
    graph.add_edge(START, "node")
    graph.add_edge("node", END)
    return graph.compile(checkpointer=saver)


def test_a_string_with_nul_characters_round_trips_exactly(make_saver):
    config = {"configurable": {"thread_id": "nul-text"}}
    text = "a\x00b\x00"
    out = _text_graph(make_saver()).invoke({"text": text, "note": ""}, config)
    assert out["note"] == text + "\x00end"
    # A fresh saver (no cache) reads the same values back from the database, and the
    # text "\\u0000" (backslash, u, zeros) stays what it is.
    state = _text_graph(make_saver()).get_state(config)
    assert state.values == {"text": text, "note": text + "\x00end"}
    literal = {"configurable": {"thread_id": "literal-escape"}}
    _text_graph(make_saver()).invoke({"text": "\\u0000", "note": ""}, literal)
    assert _text_graph(make_saver()).get_state(literal).values["text"] == "\\u0000"


def _statements(saver: RespawnSaver, read):
    """What `read(saver)` returns and how many SQL statements it sent, counted where every
    statement goes through, Django's or not: psycopg's cursors, on the thread that calls
    (which the saver lends its connection)."""
    import threading

    import psycopg

    sent = []
    originals = {name: getattr(psycopg.Cursor, name) for name in ("execute", "executemany")}

    def counting(name):
        def call(cursor, *args, **kwargs):
            if threading.get_ident() == thread:
                sent.append(args[0])
            return originals[name](cursor, *args, **kwargs)

        return call

    def run():
        nonlocal thread
        thread = threading.get_ident()
        return read(saver)

    thread = None
    try:
        for name in originals:
            setattr(psycopg.Cursor, name, counting(name))
        # Calls made inside a saver call share its connection (its methods run there).
        result = saver._own.call(run)
    finally:
        for name, original in originals.items():
            setattr(psycopg.Cursor, name, original)
    return result, len(sent)


@pytest.mark.parametrize("turns", [2, 8])
def test_reads_take_a_fixed_number_of_statements_however_long_the_thread(make_saver, turns):
    """list() and get_tuple() read checkpoints, values and writes in a constant number of
    statements, not one or two per checkpoint (time travel waits on list())."""
    from acme_graphs import builder
    from langchain_core.messages import HumanMessage

    config = {"configurable": {"thread_id": f"reads-{turns}"}}
    graph = builder().compile(checkpointer=make_saver())
    graph.invoke({"messages": [HumanMessage(f"loop {turns}")]}, config)
    # Roll the graph back to an earlier checkpoint and on again: a branch, and writes.
    history = list(graph.get_state_history(config))
    graph.invoke(None, history[len(history) // 2].config)

    fresh = make_saver()  # no cache
    fresh.get_tuple({"configurable": {"thread_id": "none"}})  # its connection, set up
    listed, statements = _statements(fresh, lambda s: list(s.list(config)))
    assert len(listed) > 2 * turns + 4
    assert statements == 1, statements  # checkpoints, values and writes at once
    # A page of it (before, limit) and a metadata filter: one statement each too.
    page, statements = _statements(
        fresh, lambda s: list(s.list(config, before=listed[2].config, limit=3))
    )
    assert statements == 1 and [t.config for t in page] == [t.config for t in listed[3:6]]
    loops, statements = _statements(fresh, lambda s: list(s.list(config, filter={"step": 1})))
    assert statements == 1
    assert [t.config for t in loops] == [t.config for t in listed if t.metadata["step"] == 1]
    # Each tuple as get_tuple reads it alone: the same values and writes.
    for item in listed:
        alone, statements = _statements(fresh, lambda s, c=item.config: s.get_tuple(c))
        assert statements == 1, statements  # the checkpoint, its values and writes at once
        assert alone.checkpoint == item.checkpoint
        assert alone.pending_writes == item.pending_writes
        assert alone.metadata == item.metadata and alone.parent_config == item.parent_config
    latest, statements = _statements(fresh, lambda s: s.get_tuple(config))
    assert statements == 1, statements
    assert latest.config == listed[0].config and latest.checkpoint == listed[0].checkpoint


def test_each_write_is_one_statement_with_its_step_and_checkpoint(make_saver):
    """On PostgreSQL a put or put_writes of a saver holding the thread's lease is one
    statement (the fenced update, its step, its checkpoint or writes), and what it writes
    is what the dashboard reads: the state names the session's agent and step count."""
    from django.utils import timezone
    from langgraph.checkpoint.base import empty_checkpoint

    from sessions_app.langgraph.saver import session_id_for
    from sessions_app.models import AgentSession, Checkpoint, GraphWrite, Step

    saver = make_saver(agent="acme-graph")
    config = {"configurable": {"thread_id": "one-statement", "checkpoint_ns": ""}}
    saver.get_tuple(config)  # its connection, set up
    first = saver.put(config, empty_checkpoint(), {"source": "input", "step": -1}, {})
    claimed = AgentSession.objects.get(id=session_id_for("one-statement"))
    second_checkpoint = empty_checkpoint()
    second_checkpoint["channel_values"] = {"messages": ["hi"], "note": "a b"}
    second_checkpoint["channel_versions"] = {"messages": "1", "note": "1"}
    second, statements = _statements(
        saver,
        lambda s: s.put(
            first, second_checkpoint, {"source": "loop", "step": 0}, {"messages": "1", "note": "1"}
        ),
    )
    assert statements == 1
    _, statements = _statements(
        saver, lambda s: s.put_writes(second, [("messages", ["there"])], "task-1")
    )
    assert statements == 1

    session = AgentSession.objects.get(id=session_id_for("one-statement"))
    assert session.last_seq == 3 and session.head == 2
    # With more than half of the lease left, a write leaves the row's indexed columns
    # alone (its lease's expiry, its updated_at within the second): a HOT update.
    assert session.lease_expires_at == claimed.lease_expires_at > timezone.now()
    assert session.lease_owner == saver._owner
    assert list(Step.objects.filter(session=session).values_list("seq", "kind")) == [
        (1, "system"),
        (2, "system"),
        (3, "system"),
    ]
    state = Checkpoint.objects.get(session=session, seq=2).state
    assert state["agent"] == {"name": "acme-graph", "version": session.agent_version}
    assert state["counters"]["steps"] == 2
    graph = state["agent_state"]["data"]["langgraph"]
    assert graph["checkpoint_id"] == second_checkpoint["id"]
    assert GraphWrite.objects.get(session=session).seq == 3
    loaded = saver.get_tuple(config)
    assert loaded.checkpoint["channel_values"] == {"messages": ["hi"], "note": "a b"}
    assert loaded.pending_writes == [("task-1", "messages", ["there"])]

    # A state stored sealed (here a NUL in a value's summary, which jsonb cannot hold) has
    # its exact copy out of a statement's reach: it is written with the row's values known,
    # in the locked path, and reads back whole.
    from sessions_app.sealing import exact

    third_checkpoint = empty_checkpoint()
    third_checkpoint["channel_values"] = {"messages": ["hi"], "note": "a\x00b"}
    third_checkpoint["channel_versions"] = {"messages": "1", "note": "2"}
    saver.put(second, third_checkpoint, {"source": "loop", "step": 1}, {"note": "2"})
    state = Checkpoint.objects.get(session=session, seq=4).state
    whole = exact(state)
    assert (
        whole["agent"] == state["agent"] == {"name": "acme-graph", "version": session.agent_version}
    )
    assert whole["counters"]["steps"] == state["counters"]["steps"] == 4
    loaded = saver.get_tuple(config)
    assert loaded.checkpoint["channel_values"] == {"messages": ["hi"], "note": "a\x00b"}
