"""What a graph's deploy gate reads from a LangGraph checkpoint: the nodes it would run
next, where an interrupt waits, where a Send goes (sessions_app.langgraph.gate)."""

from __future__ import annotations

from types import SimpleNamespace

from acme_graphs import builder, builder_without_model
from langgraph.types import Send

from sessions_app.langgraph.gate import Latest, describe, session_problems

HEAD = SimpleNamespace(agent_name="acme-graph", session_id="s1")


def _checkpoint(**extra) -> dict:
    return {
        "channel_versions": {"messages": "2", "branch:to:model": "3", "branch:to:tools": "2"},
        # `tools` saw its trigger's latest version; `model` has not run on its own yet.
        "versions_seen": {"tools": {"branch:to:tools": "2"}, "model": {"branch:to:model": "2"}},
        "channel_values": {},
        **extra,
    }


def test_describe_lists_the_nodes_of_a_graph_or_of_a_function_building_one():
    assert describe(builder()).nodes == ("model", "tools")
    assert describe(builder_without_model).nodes == ("assistant", "tools")
    assert describe(builder().compile()).kind == "LangGraph graph"


def test_a_next_node_gone_from_the_graph_is_named():
    latest = Latest(seq=7, checkpoint=_checkpoint(), interrupted=frozenset())
    assert session_problems(builder(), HEAD, latest) == []
    [problem] = session_problems(builder_without_model(), HEAD, latest)
    assert problem.where == "next node at seq 7 (model)"
    assert "has no node 'model' (its nodes: assistant, tools)" in problem.error


def test_an_interrupt_is_named_once_and_a_pending_send_by_its_target():
    checkpoint = _checkpoint(channel_values={"__pregel_tasks": [Send("model", {"x": 1})]})
    latest = Latest(seq=9, checkpoint=checkpoint, interrupted=frozenset({"model"}))
    wheres = [p.where for p in session_problems(builder_without_model(), HEAD, latest)]
    assert wheres == [
        "interrupt waiting for an answer at seq 9 (model)",
        "pending send at seq 9 (model)",
    ]
    assert session_problems(builder_without_model(), HEAD, None) == []
