"""What a LangGraph graph run by Respawn is, and what a new release of it would strand: the
agents page and the deploy gate read graphs as they read Respawn's own agents.

`describe` gives the graph's nodes. `session_problems` takes a live session's latest
LangGraph checkpoint (as the saver loads it: `saver.latest_checkpoint`) and names each
node it would run next that the graph no longer has: the node an `interrupt()` waits in
(answering it would drop the operator's answer: LangGraph finds no task to resume), a node
the run stopped before, and the target of a pending `Send`.

Sessions a program writes through `RespawnSaver` alone (no `graph_agent` registered) are
run by that program, not by the workers: `CHECKPOINTER_AGENT` names them, and the deploy
gate reports them as checked by their program, never as problems.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent_runtime.runners import Problem, RunnerDescription

from ..sdk_glue import CHECKPOINTER_AGENT

__all__ = ["CHECKPOINTER_AGENT", "KIND", "Latest", "describe", "node_names", "session_problems"]

KIND = "LangGraph graph"
# LangGraph's names (langgraph._internal._constants): the channel that triggers a node,
# the writes of an interrupt, the channel of pending Sends, and the entry node.
TRIGGER_PREFIX = "branch:to:"
INTERRUPT = "__interrupt__"
TASKS = "__pregel_tasks"
START = "__start__"


@dataclass(frozen=True)
class Latest:
    """A thread's latest checkpoint as the saver loads it: the seq of its step, the
    LangGraph checkpoint (channel values loaded), and the nodes an interrupt waits in."""

    seq: int
    checkpoint: dict[str, Any]
    interrupted: frozenset[str]


def built(graph: Any) -> Any:
    """The graph a GraphRunner holds: a StateGraph, a compiled graph, or a function
    returning either."""
    if callable(graph) and not hasattr(graph, "invoke") and not hasattr(graph, "compile"):
        return graph()
    return graph


def node_names(graph: Any) -> list[str]:
    """The graph's nodes, in the order they were added (without LangGraph's entry node)."""
    nodes = getattr(built(graph), "nodes", None) or {}
    return [name for name in nodes if name != START]


def describe(graph: Any) -> RunnerDescription:
    return RunnerDescription(kind=KIND, nodes=tuple(node_names(graph)))


def _next_nodes(checkpoint: dict[str, Any]) -> list[str]:
    """The nodes a checkpoint triggers and has not run: each whose trigger channel has a
    version newer than the one the node last saw (how LangGraph plans its next tasks)."""
    versions = checkpoint.get("channel_versions") or {}
    seen = checkpoint.get("versions_seen") or {}
    out = []
    for channel, version in versions.items():
        if not channel.startswith(TRIGGER_PREFIX):
            continue
        node = channel[len(TRIGGER_PREFIX) :]
        last = (seen.get(node) or {}).get(channel)
        if last is None or str(last) < str(version):
            out.append(node)
    return out


def session_problems(graph: Any, head: Any, latest: Latest | None) -> list[Problem]:
    """Each node the session's latest checkpoint (`latest`, read by the saver) would run
    next that `graph` lacks: where an interrupt waits, where the run stopped, where a Send
    goes. None: the thread has no checkpoint yet, and nothing of the graph's to run."""
    if latest is None:
        return []
    have = node_names(graph)
    listed = ", ".join(have) or "none"
    problems: list[Problem] = []

    def gone(where: str, node: str) -> None:
        problems.append(
            Problem(
                f"{where} at seq {latest.seq} ({node})",
                f"the graph of agent {head.agent_name!r} has no node {node!r} (its nodes: "
                f"{listed}): resuming the session would not run it",
            )
        )

    for node in sorted(latest.interrupted):
        if node not in have:
            gone("interrupt waiting for an answer", node)
    for node in _next_nodes(latest.checkpoint):
        if node not in have and node not in latest.interrupted:
            gone("next node", node)
    for send in (latest.checkpoint.get("channel_values") or {}).get(TASKS) or ():
        target = getattr(send, "node", None)
        if isinstance(target, str) and target not in have:
            gone("pending send", target)
    return problems
