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
Any other exception fails the session with its message. Adapters for other frameworks
(`sessions_app.langgraph.graph_agent`) are built on this.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from .state import (
    NewStep,
    SessionStatus,
    StepKind,
    SystemEvent,
    SystemPayload,
    error_payload,
    system_step,
)
from .store import Lease, LeaseLost, SessionHead, SessionStore, utcnow

if TYPE_CHECKING:
    from .agents import Agent
    from .loop.heartbeat import Heartbeat
    from .loop.run import RunConfig, RunResult


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
    agent: Agent
    _heartbeat: Heartbeat | None = None

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


_STATUS = {
    RunnerStatus.COMPLETED: SessionStatus.COMPLETED,
    RunnerStatus.WAITING_INPUT: SessionStatus.WAITING_INPUT,
    RunnerStatus.FAILED: SessionStatus.FAILED,
    RunnerStatus.CANCELLED: SessionStatus.CANCELLED,
}


def run_with_runner(
    *,
    store: SessionStore,
    agent: Agent,
    config: RunConfig,
    lease: Lease,
    head: SessionHead,
) -> RunResult:
    """The run of a runner agent's session, once `run_session` holds its lease."""
    from .loop.heartbeat import Heartbeat
    from .loop.run import Outcome, RunResult, run_started

    runner = agent.runner
    assert runner is not None  # run_session hands only runner agents' sessions here
    session_id = head.session_id
    last_ran = head.checkpoint.state.agent_version if head.checkpoint else None
    refusal = agent.refusal(started=head.agent_version, last_ran=last_ran)
    if refusal is not None:
        store.release(lease)
        return RunResult(session_id, Outcome.INCOMPATIBLE, error=refusal)
    context = RunContext(
        session_id=session_id,
        lease=lease,
        store=store,
        head=head,
        worker_id=config.worker_id,
        agent=agent,
    )
    try:
        store.append(
            lease,
            [
                system_step(
                    run_started(head, worker=config.worker_id, agent_version=agent.version)
                    | SystemPayload(runner=type(runner).__name__),
                    started_at=utcnow(),
                )
            ],
        )
        with Heartbeat(store, lease, config.lease_ttl, config.heartbeat_every) as heartbeat:
            context._heartbeat = heartbeat
            try:
                result = runner.run(context)
            except (LeaseLost, RunnerCancelled):
                raise
            except Exception as exc:  # the runner's own code failed: the session fails
                result = RunnerResult.failed(f"{type(exc).__name__}: {exc}")
            if not isinstance(result, RunnerResult):
                result = RunnerResult.failed(
                    f"runner of agent {agent.name!r} returned {type(result).__name__}, "
                    "not a RunnerResult"
                )
    except RunnerCancelled:
        result = RunnerResult(RunnerStatus.CANCELLED)
    except LeaseLost as exc:
        return RunResult(session_id, Outcome.LEASE_LOST, error=str(exc))
    status = _STATUS[result.status]
    if result.status == RunnerStatus.FAILED:
        step = NewStep(
            kind=StepKind.ERROR,
            payload=error_payload("runner", result.error or "failed", **result.detail),
        )
    else:
        finished = SystemPayload(
            event=SystemEvent.RUN_FINISHED
            if result.status != RunnerStatus.CANCELLED
            else SystemEvent.CANCELLED,
            outcome=result.status.value,
            worker=config.worker_id,
        )
        if result.final_answer:
            finished["final_answer"] = result.final_answer
        # A runner's own details (a LangGraph runner's interrupts, say) go in as they are.
        step = system_step(cast(SystemPayload, {**finished, **result.detail}))
    try:
        store.append(lease, [step], status=status, error=result.error, release=True)
    except LeaseLost as exc:
        return RunResult(session_id, Outcome.LEASE_LOST, error=str(exc))
    return RunResult(
        session_id,
        Outcome(result.status.value),
        final_answer=result.final_answer,
        error=result.error,
    )
