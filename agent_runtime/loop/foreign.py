"""A run of an agent whose turn loop is not Respawn's (agent_runtime.runners): once
`run_session` holds the lease, everything around the runner's turn loop stays the engine's:
the agent-version rule, the `run_started` step, the heartbeat, the fence, the operator's
cancel, and the closing step and status written from the `RunnerResult`."""

from __future__ import annotations

from typing import cast

from ..agents import Agent
from ..runners import RunContext, RunnerCancelled, RunnerResult, RunnerStatus
from ..state import (
    NewStep,
    SessionStatus,
    StepKind,
    SystemEvent,
    SystemPayload,
    error_payload,
    system_step,
)
from ..store import Lease, LeaseLost, SessionHead, SessionStore, utcnow
from .config import Outcome, RunConfig, RunResult, run_started
from .heartbeat import Heartbeat, came_back

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
        came_back(store, lease)
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
        store.append(
            lease,
            [step],
            status=status,
            error=result.error,
            release=True,
            final_answer=result.final_answer,
        )
    except LeaseLost as exc:
        came_back(store, lease)
        return RunResult(session_id, Outcome.LEASE_LOST, error=str(exc))
    return RunResult(
        session_id,
        Outcome(result.status.value),
        final_answer=result.final_answer,
        error=result.error,
    )
