"""Respawn's side of the benches: the real engine (`run_session`) with the Django store.

The agent is the bench workload (`_workload.py`): a scripted model that answers instantly
with one tool call per turn until the last turn, and a tool that returns its argument.
Everything else is what a worker runs: the redactor, payload validation, the lease, the
heartbeat thread, the fenced append, a checkpoint at every turn boundary.
"""

from __future__ import annotations

import uuid
from typing import Any

from ._workload import Timings, model_text, tool_output

AGENT = "bench"
# The search index (written off the append, by the workers' indexer) counts as storage.
TABLES = [
    "sessions_app_agentsession",
    "sessions_app_step",
    "sessions_app_checkpoint",
    "sessions_app_stepsearch",
]


class BenchModel:
    """Zero latency. Reads the turn from the conversation's last tool result, so a resumed
    session gets the same turn an uninterrupted one would."""

    def __init__(self, payload_bytes: int) -> None:
        self.payload_bytes = payload_bytes

    def complete(self, messages, tools, settings):
        from agent_runtime.providers.base import ModelTurn, ToolCall, Usage

        last = messages[-1]
        turn = int(last.tool_call_id.rsplit("_", 1)[1]) + 1 if last.role == "tool" else 0
        target = int(messages[1].content.rsplit(" ", 1)[1])  # "run N turns"
        text = model_text(turn, self.payload_bytes)
        if turn < target:
            call = ToolCall(id=f"call_{turn}", name="echo_n", arguments={"n": turn})
            return ModelTurn(text=text, tool_calls=[call], usage=Usage(10, 5))
        return ModelTurn(text=text, usage=Usage(10, 5))


def turns_for(steps: int) -> int:
    """Turns that make about `steps` steps: user + run_started + 3 per turn + the answer."""
    return max(1, (steps - 3) // 3)


def agents(payload_bytes: int, max_steps: int = 1_000_000):
    from agent_runtime.agents import Agent, AgentRegistry, Limits
    from agent_runtime.tools import ToolContext, tool

    @tool(name="echo_n")
    def echo_n(ctx: ToolContext, n: int) -> dict[str, Any]:
        """Return n (and the workload's text)."""
        return tool_output(n, payload_bytes)

    return AgentRegistry(
        [
            Agent(
                name=AGENT,
                version="1",
                description="bench workload",
                model="bench:scripted",
                instructions="Run the tool once per turn.",
                tools=[echo_n],
                limits=Limits(max_steps=max_steps),
            )
        ]
    )


def make_provider_factory(payload_bytes: int):
    model = BenchModel(payload_bytes)

    def make_provider(spec: str, options: dict[str, Any]):
        return model, "scripted"

    return make_provider


def create_session(turns: int) -> str:
    from agent_runtime.state import user_payload
    from sessions_app.models import AgentSession, Step

    session = AgentSession.objects.create(
        agent=AGENT, title=f"bench {turns} turns", last_seq=1, step_count=1
    )
    Step.objects.create(session=session, seq=1, kind="user", payload=user_payload(f"run {turns}"))
    return str(session.id)


def timed_store(timings: Timings):
    """The Django store, marking the time after each committed append."""
    from sessions_app.store import dialect

    class TimedStore(dialect()):  # type: ignore[misc]
        def append(self, *args, **kwargs):
            result = super().append(*args, **kwargs)
            timings.mark()
            return result

    return TimedStore()


def run_config(worker_id: str | None = None, lease_ttl: float = 10.0):
    from agent_runtime.loop import RunConfig
    from sessions_app.runtime import redactor

    return RunConfig(
        worker_id=worker_id or f"bench:{uuid.uuid4().hex[:8]}",
        lease_ttl=lease_ttl,
        redactor=redactor(),
    )


def run(session_id: str, payload_bytes: int, timings: Timings | None = None):
    from agent_runtime.loop import run_session
    from sessions_app.store import DjangoEffects, session_store

    store = timed_store(timings) if timings is not None else session_store()
    if timings is not None:
        timings.start()
    return run_session(
        session_id,
        store=store,
        agents=agents(payload_bytes),
        effects=DjangoEffects(),
        config=run_config(),
        make_provider=make_provider_factory(payload_bytes),
    )


def truncate() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(TABLES)} CASCADE")
        cursor.execute("DELETE FROM sessions_app_searchcursor")
