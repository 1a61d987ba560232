"""LangGraph graphs on Respawn (needs the `langgraph` extra): `saver` holds RespawnSaver and
AsyncRespawnSaver (LangGraph checkpointers whose threads are Respawn sessions) and
graph_agent (a graph run on the workers through the engine's Runner protocol). Everything a
program imports is here: `from sessions_app.langgraph import RespawnSaver, graph_agent`."""

from .saver import (
    AsyncRespawnSaver,
    GraphRunner,
    RespawnSaver,
    ThreadLeaseLost,
    graph_agent,
    session_id_for,
)

__all__ = [
    "AsyncRespawnSaver",
    "GraphRunner",
    "RespawnSaver",
    "ThreadLeaseLost",
    "graph_agent",
    "session_id_for",
]
