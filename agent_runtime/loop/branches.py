"""Fan-out branches: one tool call of a turn run as its own job, and the join.

A run that fans out (`agent_runtime.loop.run`) records the turn's calls and a `fan_out`
step; each branch job runs one call under the fan-out's lease, and the branch that records
the turn's last result checkpoints the turn and gives the lease back.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass

from ..agents import Agent, AgentRegistry, UnknownAgent
from ..records import RecordSource
from ..state import (
    NewCheckpoint,
    NewStep,
    StateError,
    StepKind,
    StepRecord,
    SystemEvent,
    SystemPayload,
    as_system,
    as_tool_call,
    system_step,
)
from ..store import EffectLedger, Lease, LeaseLost, SessionStore, utcnow
from ..telemetry import RunRecord, ToolCallRecord, guarded, observe
from ..tools import ToolContext, ToolOutcome
from ..upgraders import IncompatibleSchemaError
from .heartbeat import Heartbeat
from .run import RunConfig, recorded_key, result_payload, tool_context
from .trace import apply_step, current_fan_out, replay


class BranchOutcome(enum.StrEnum):
    RECORDED = "recorded"  # the result is in; other calls of the turn are still running
    JOINED = "joined"  # the turn's last result: checkpointed, the session runs next
    NOT_NEEDED = "not_needed"  # answered already, not of the current turn, or not a branch
    FENCED = "fenced"  # the fan-out was fenced off (a new wave, a rollback, a cancel)
    INCOMPATIBLE = "incompatible"


@dataclass(frozen=True)
class BranchResult:
    session_id: str
    seq: int
    outcome: BranchOutcome
    branches: tuple[int, ...] = ()  # calls of the same turn to enqueue now (the next wave)
    error: str | None = None


def run_branch(
    session_id: str,
    seq: int,
    *,
    store: SessionStore,
    agents: AgentRegistry,
    effects: EffectLedger,
    config: RunConfig,
    records: RecordSource | None = None,
) -> BranchResult:
    """Run the fan-out branch for the tool call at `seq`, and join the turn if its result
    is the last one.

    A branch writes under the lease of the run that fanned out (owner and token from the
    `fan_out` step), so every write is fenced as the run's own would be, and the session
    still has one writer of its turn sequence: a new run, a rollback or a cancel bumps the
    token and fences late branches off. The result is appended only if the call has none
    yet, decided under the session row's lock (`append_branch_result`); the append that
    finds every call of the fan-out answered is the join, and exactly one append can."""
    try:
        head = store.load_head(session_id)
    except IncompatibleSchemaError as exc:
        return BranchResult(session_id, seq, BranchOutcome.INCOMPATIBLE, error=str(exc))
    found = current_fan_out(head.history)
    if found is None:
        return BranchResult(session_id, seq, BranchOutcome.NOT_NEEDED)
    action, fan_step = found
    fan = as_system(fan_step.payload)
    fan_calls: list[int] = list(fan["calls"])
    pending = {p.tool_call_step.seq: p for p in action.calls if p.tool_call_step is not None}
    if seq not in fan_calls or seq not in pending:
        return BranchResult(session_id, seq, BranchOutcome.NOT_NEEDED)
    lease = Lease(session_id, fan["owner"], int(fan["token"]))
    renewed_at = time.monotonic()
    if not store.heartbeat(lease, config.lease_ttl).alive:
        return _refused(store, session_id, seq, pending[seq].call.id)
    try:
        agent = agents.get(head.agent_name)
    except UnknownAgent as exc:
        return BranchResult(session_id, seq, BranchOutcome.NOT_NEEDED, error=str(exc))
    try:
        state = replay(head, agent)
    except StateError as exc:
        return BranchResult(session_id, seq, BranchOutcome.INCOMPATIBLE, error=str(exc))
    refusal = agent.refusal(started=head.agent_version, last_ran=state.agent_version)
    stored = state.agent_state
    if (
        refusal is None
        and agent.state is not None
        and (stored is None or stored["version"] != agent.state.version)
    ):
        # The run that fanned out kept another version of the agent state: its changes
        # could not apply. Left to a run of this code, which upgrades the state first
        # and fans the calls out again once the lease expires.
        refusal = (
            f"agent {agent.name!r}: the fan-out's agent state is at version "
            f"{None if stored is None else stored['version']}, this code's at "
            f"{agent.state.version}"
        )
    if refusal is not None:
        return BranchResult(session_id, seq, BranchOutcome.NOT_NEEDED, error=refusal)
    call = pending[seq].call
    step = pending[seq].tool_call_step
    assert step is not None
    key = recorded_key(session_id, step)
    tool = agent.tool_registry.get(call.name)
    with Heartbeat(
        store, lease, config.lease_ttl, config.heartbeat_every, since=renewed_at
    ) as heartbeat:
        started = utcnow()

        def context(attempt: int) -> ToolContext:
            heartbeat.ensure()  # never start a call after the lease is gone
            return tool_context(
                store=store,
                lease=lease,
                heartbeat=heartbeat,
                agent=agent,
                state=state,
                effects=effects,
                records=records,
                options=config.tool_options,
                call_id=call.id,
                seq=seq,
                key=key,
                attempt=attempt,
            )

        if tool is None:
            outcome = ToolOutcome(ok=False, error=f"unknown tool {call.name!r}", failure="tool")
        else:
            # A branch is its own job, not a run: its call is reported on its own, in the
            # session's trace (sessions_app.telemetry parents it on the session).
            branch = RunRecord(session_id, agent.name, agent.version, config.worker_id)
            observed = ToolCallRecord(branch, call.name, call.id)
            try:
                with observe(config.telemetry, "tool_call", observed):
                    outcome = tool.run(context, call.arguments, config.transient)
                    observed.ok, observed.error = outcome.ok, outcome.error
                    observed.attempts = outcome.attempts
            except LeaseLost:
                guarded(config.telemetry.fenced, branch, "tool_call")
                return _refused(store, session_id, seq, call.id)
        if heartbeat.lost.is_set():
            return _refused(store, session_id, seq, call.id)
        payload = result_payload(call, outcome, branch=as_tool_call(step.payload).get("branch"))
        result = NewStep(
            kind=StepKind.TOOL_RESULT,
            payload=config.redactor.redact(payload) if config.redactor else payload,
            started_at=started,
            finished_at=utcnow(),
        )
        try:
            appended = store.append_branch_result(
                lease, result, call_id=call.id, after_seq=action.model_seq
            )
        except LeaseLost:
            return _refused(store, session_id, seq, call.id)
        if appended.seq is None:
            return BranchResult(session_id, seq, BranchOutcome.NOT_NEEDED)
        if appended.unanswered:
            # The next wave: the result just written frees one slot of the agent's limit.
            # Each append gets a distinct count (the row lock orders them), so each waiting
            # call is enqueued by exactly one branch.
            limit = int(fan.get("limit") or len(fan_calls))
            answered = len(fan_calls) - appended.unanswered
            index = limit + answered - 1
            more = (fan_calls[index],) if index < len(fan_calls) else ()
            return BranchResult(session_id, seq, BranchOutcome.RECORDED, branches=more)
        return _join(session_id, seq, store=store, agent=agent, lease=lease, fan=fan_step)


def _refused(store: SessionStore, session_id: str, seq: int, call_id: str) -> BranchResult:
    """The outcome of a branch whose lease check failed. The join releases the fan-out's
    lease once every call is answered, so a duplicate of a branch (its job run twice) that
    checks after the join finds the lease gone without being fenced off: its call was
    answered by the other copy, and it was not needed. Fenced means the call has no
    result: a new wave, a rollback or a cancel took the session away."""
    history = store.load_head(session_id).history
    answered = any(s.kind == StepKind.TOOL_RESULT and s.call_id == call_id for s in history)
    outcome = BranchOutcome.NOT_NEEDED if answered else BranchOutcome.FENCED
    return BranchResult(session_id, seq, outcome)


def _join(
    session_id: str,
    seq: int,
    *,
    store: SessionStore,
    agent: Agent,
    lease: Lease,
    fan: StepRecord,
) -> BranchResult:
    """Checkpoint the joined turn and give the lease back: the session's next run (the job
    enqueues it) calls the model with every result in."""
    head = store.load_head(session_id)
    state = replay(head, agent)
    joined = system_step(
        SystemPayload(
            event=SystemEvent.JOINED,
            fan_out_seq=fan.seq,
            results=len(as_system(fan.payload)["calls"]),
        ),
        started_at=utcnow(),
    )
    apply_step(state, joined.at(head.last_seq + 1))
    try:
        store.append(lease, [joined], checkpoint=NewCheckpoint(state=state), release=True)
    except LeaseLost:
        return BranchResult(session_id, seq, BranchOutcome.FENCED)
    return BranchResult(session_id, seq, BranchOutcome.JOINED)
