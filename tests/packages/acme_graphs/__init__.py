"""A team's own LangGraph graph, outside Respawn, registered as an agent with
`sessions_app.langgraph.saver.graph_agent` (RESPAWN_AGENTS=acme_graphs:agents).

A model node and a tool node in a loop, with no LLM: "loop N" makes the model call the
`work` tool N times, then answer "Worked N steps."; "approve X" makes it ask a person
through `interrupt()` and answer with what they said. ACME_GRAPH_DELAY (seconds, default
0) is how long each work call takes.
"""

from __future__ import annotations

import os
import re
import time
from typing import Annotated, TypedDict

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt

from sessions_app.langgraph.saver import graph_agent


class State(TypedDict):
    messages: Annotated[list, add_messages]


def _request(messages: list) -> tuple[str, int]:
    """The last user message, and how many tool results came after it."""
    for index in range(len(messages) - 1, -1, -1):
        if isinstance(messages[index], HumanMessage):
            after = messages[index + 1 :]
            return messages[index].content, sum(isinstance(m, ToolMessage) for m in after)
    return "", 0


# What a LangChain chat model records of itself on each message it returns.
MODEL = {"model_name": "acme-fake-1"}


def model(state: State) -> dict:
    request, done = _request(state["messages"])
    if match := re.match(r"approve (?P<what>.+)", request):
        answer = interrupt({"question": f"may I {match['what']}?"})
        return {"messages": [AIMessage(f"{match['what']}: {answer}", response_metadata=MODEL)]}
    match = re.match(r"loop (?P<n>\d+)", request)
    wanted = int(match["n"]) if match else 0
    if done < wanted:
        call = {"name": "work", "args": {"step": done + 1}, "id": f"call-{len(state['messages'])}"}
        return {"messages": [AIMessage("", tool_calls=[call], response_metadata=MODEL)]}
    return {
        "messages": [
            AIMessage(
                f"Worked {wanted} steps." if wanted else f"You said: {request}",
                response_metadata=MODEL,
            )
        ]
    }


def tools(state: State) -> dict:
    call = state["messages"][-1].tool_calls[0]
    time.sleep(float(os.environ.get("ACME_GRAPH_DELAY", "0")))
    return {"messages": [ToolMessage(f"step {call['args']['step']} done", tool_call_id=call["id"])]}


def route(state: State) -> str:
    last = state["messages"][-1]
    return "tools" if getattr(last, "tool_calls", None) else END


def builder(model_node: str = "model") -> StateGraph:
    graph = StateGraph(State)
    graph.add_node(model_node, model)
    graph.add_node("tools", tools)
    graph.add_edge(START, model_node)
    graph.add_conditional_edges(model_node, route, ["tools", END])
    graph.add_edge("tools", model_node)
    return graph


agents = [graph_agent("acme-graph", builder(), version="1", description="loops and approvals")]


def builder_without_model() -> StateGraph:
    """The next release, whose model node is called `assistant`: a session waiting in
    `model` (at an interrupt) has nothing to resume in it."""
    return builder(model_node="assistant")


agents_renamed_node = [graph_agent("acme-graph", builder_without_model(), version="2")]

# A deployment that runs the threads a RespawnSaver wrote under its default agent name.
agents_named_langgraph = [graph_agent("langgraph", builder(), version="1")]
