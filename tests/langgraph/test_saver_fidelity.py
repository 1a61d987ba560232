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
