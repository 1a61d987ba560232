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
    """What `read(saver)` returns and the SQL statements it ran (on the saver's thread,
    whose connection the saver uses)."""
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    def capture():
        with CaptureQueriesContext(connections[saver._db]) as queries:
            result = read(saver)
        return result, len(queries.captured_queries)

    # Calls from the saver's own thread run there directly (its methods hop to it).
    return saver._thread.call(capture)


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
    listed, statements = _statements(fresh, lambda s: list(s.list(config)))
    assert len(listed) > 2 * turns + 4
    assert statements <= 4, statements
    # Each tuple as get_tuple reads it alone: the same values and writes.
    for item in listed:
        alone, statements = _statements(fresh, lambda s, c=item.config: s.get_tuple(c))
        assert statements <= 4, statements
        assert alone.checkpoint == item.checkpoint
        assert alone.pending_writes == item.pending_writes
        assert alone.metadata == item.metadata and alone.parent_config == item.parent_config
    _, statements = _statements(fresh, lambda s: s.get_tuple(config))
    assert statements <= 4, statements
