"""Agents whose turn loop is not Respawn's: a foreign runner under the session's lease.

An `Agent(name=..., runner=...)` hands each run of its sessions to `runner.run(context)`
instead of Respawn's model/tool loop. Everything around the turn loop stays Respawn's:
the worker claims the lease (a second worker gets nothing), the poison-session check, the
agent-version rule, the `run_started` step, the heartbeat, fencing (every write the runner
makes through `context.store` or an adapter bound to `context.lease` is refused once the
lease is fenced off), the operator's cancel, crash recovery (the reconciler enqueues the
session again and the next run starts from what the runner committed) and the closing
step and status, written from the `RunnerResult` the runner returns.

    class MyRunner:
        def run(self, context: RunContext) -> RunnerResult:
            ...  # read context.head, write through an adapter bound to context.lease
            return RunnerResult.completed("the answer")

    agent = Agent(name="my-graph", version="2", runner=MyRunner())

A runner raises `RunnerCancelled` when it sees `context.cancel_requested()` (or its
storage reports the cancel), and lets `LeaseLost` propagate: then nothing more is written.
Any other exception fails the session with its message. This module is the protocol only:
the run around a runner is agent_runtime.loop.foreign's. Adapters for other frameworks
(`sessions_app.langgraph.saver.graph_agent`) are built on this.

A runner may also say what it runs and check a stored session against it, so that the
dashboard and the deploy gate treat every kind of agent alike:

    def describe(self) -> RunnerDescription: ...   # kind, model, instructions, tools, nodes
    def session_problems(self, head: SessionHead) -> list[Problem]: ...

`describe` feeds the agents page and the session header (`DescribedRunner`);
`session_problems` names what a deploy of this runner would strand in a live session (a
call waiting for approval to a tool that is gone, an interrupt in a node that is gone)
and is called by agent_runtime.compat, the deploy gate (`CheckedRunner`).
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .store import Lease, LeaseLost, SessionHead, SessionStore


@dataclass(frozen=True)
class Problem:
    """Why a session would not run on this code: where (what it names in the session) and
    the error. Found by the deploy gate (agent_runtime.compat) and by runners."""

    where: str  # "agent", "agent state", "tool call at seq 12 (send_payment)"
    error: str


@dataclass(frozen=True)
class ToolDescription:
    """A tool as a runner declares it (the agents page shows it like a Respawn tool)."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)  # the JSON schema
    needs_approval: bool = False


@dataclass(frozen=True)
class RunnerDescription:
    """What a runner runs: `kind` ("LangGraph graph"), the model it calls (empty when it
    does not say), its instructions, its tools and, for a graph, its nodes."""

    kind: str
    model: str = ""
    instructions: str = ""
    tools: tuple[ToolDescription, ...] = ()
    nodes: tuple[str, ...] = ()


class RunnerAgent(Protocol):
    """What a runner sees of its agent (an agent_runtime.agents.Agent)."""

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str: ...


class LeaseWatch(Protocol):
    """What a runner sees of the run's heartbeat (agent_runtime.loop.heartbeat.Heartbeat)."""

    @property
    def cancel_requested(self) -> bool: ...

    @property
    def lost(self) -> threading.Event: ...


class RunnerCancelled(Exception):
    """The session's cancel was requested; the runner stopped at a point it committed."""


class RunnerStatus(enum.StrEnum):
    COMPLETED = "completed"
    WAITING_INPUT = "waiting_input"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class RunnerResult:
    """How a runner's run ended; `detail` is recorded in the closing step."""

    status: RunnerStatus
    final_answer: str | None = None
    error: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def completed(cls, answer: str | None = None, **detail: Any) -> RunnerResult:
        return cls(RunnerStatus.COMPLETED, final_answer=answer, detail=detail)

    @classmethod
    def waiting(cls, reason: str, **detail: Any) -> RunnerResult:
        """Waiting for a person (an approval, an answer): the session is `waiting_input`."""
        return cls(RunnerStatus.WAITING_INPUT, detail={"reason": reason, **detail})

    @classmethod
    def failed(cls, error: str, **detail: Any) -> RunnerResult:
        return cls(RunnerStatus.FAILED, error=error, detail=detail)


@dataclass
class RunContext:
    """What a runner gets: the session, the lease its writes must carry, the store, and
    what the session held when the run started (the head checkpoint and the live steps
    from `head.history_from` on)."""

    session_id: str
    lease: Lease
    store: SessionStore
    head: SessionHead
    worker_id: str
    agent: RunnerAgent
    _heartbeat: LeaseWatch | None = None

    def cancel_requested(self) -> bool:
        """True once someone asked the session to stop (seen by the heartbeat)."""
        return bool(self._heartbeat is not None and self._heartbeat.cancel_requested)

    def lease_lost(self) -> bool:
        """True once another holder fenced this run off: write nothing more."""
        return bool(self._heartbeat is not None and self._heartbeat.lost.is_set())

    def check(self) -> None:
        """Raise LeaseLost or RunnerCancelled where the run must stop."""
        if self.lease_lost():
            raise LeaseLost(f"session {self.session_id}: heartbeat found the lease fenced off")
        if self.cancel_requested():
            raise RunnerCancelled(f"session {self.session_id}: cancel requested")


@runtime_checkable
class Runner(Protocol):
    def run(self, context: RunContext) -> RunnerResult: ...


@runtime_checkable
class DescribedRunner(Protocol):
    """A runner that says what it runs (optional, beside `run`)."""

    def describe(self) -> RunnerDescription: ...


@runtime_checkable
class CheckedRunner(Protocol):
    """A runner that checks a stored session against what it runs now (optional, beside
    `run`): the problems a run of `head` (loaded whole, by `load_head`) would meet, empty
    when it would run."""

    def session_problems(self, head: SessionHead) -> list[Problem]: ...
