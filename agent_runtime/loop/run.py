"""A run of a session: claim, load, think, act, checkpoint, repeat.

`run_session` takes the session's lease and advances it as far as it goes: to an answer, a
pause, a failure, a cancel, or a fan-out of the turn's tool calls to branch jobs
(`agent_runtime.loop.branches`). What it does at each step is what the trace says next
(`agent_runtime.loop.trace`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..agents import Agent, AgentRegistry, AgentStateError, UnknownAgent
from ..pricing import PriceTable
from ..providers import Message, ModelSettings, ModelTurn, Provider, ProviderError, ToolCall
from ..providers import make_provider as default_make_provider
from ..providers.base import Usage
from ..records import RecordSource
from ..state import (
    BranchLabel,
    NewCheckpoint,
    NewStep,
    OperatorAction,
    PlanUpdateItem,
    SessionState,
    SessionStatus,
    StateError,
    StepKind,
    StepRecord,
    SystemEvent,
    SystemPayload,
    ToolCallPayload,
    UsagePayload,
    as_operator,
    as_system,
    as_tool_call,
    error_payload,
    model_payload,
    stored,
    system_step,
)
from ..store import EffectLedger, Lease, LeaseLost, SessionHead, SessionStore, utcnow
from ..telemetry import (
    ModelCallRecord,
    RunRecord,
    ToolCallRecord,
    guarded,
    observe,
)
from ..tools import Tool, ToolContext, ToolOutcome
from ..upgraders import IncompatibleSchemaError
from .config import (
    BUDGET_REACHED,
    Outcome,
    ProviderFactory,
    RunConfig,
    RunResult,
    run_started,
)
from .conversation import Conversation
from .foreign import run_with_runner
from .heartbeat import Heartbeat, came_back, fence_guard
from .trace import (
    CallModel,
    Finished,
    RunTools,
    apply_step,
    next_action,
    replay,
    uncertain_resolution,
)

log = logging.getLogger("respawn.loop")


def start_agent_state(
    agent: Agent, state: SessionState
) -> tuple[dict[str, Any] | None, tuple[str, ...]]:
    """Load the agent's own state for a run, upgraded to the agent's state version.
    Returns the whole agent state when the run must record it (it is new, or upgraders
    were applied), and the upgraders applied. Raises AgentStateError when this code
    cannot load it."""
    if agent.state is None:
        return None, ()
    try:
        loaded, applied = agent.state.load(state.agent_state)
    except AgentStateError as exc:
        raise AgentStateError(f"agent {agent.name!r}: {exc}") from exc
    record = state.agent_state is None or bool(applied)
    state.agent_state = loaded
    return (loaded if record else None), applied


class _Stop(Exception):
    def __init__(self, result: RunResult) -> None:
        self.result = result


class _Run:
    def __init__(
        self,
        *,
        store: SessionStore,
        agent: Agent,
        effects: EffectLedger,
        config: RunConfig,
        lease: Lease,
        records: RecordSource | None = None,
        head: SessionHead,
        make_provider: ProviderFactory,
    ) -> None:
        self.store = store
        self.agent = agent
        self.effects = effects
        self.records = records
        self.config = config
        self.lease = lease
        self.session_id = head.session_id
        # From the last model step on (load_tail): all that deciding the next action, the
        # fan-out and the uncertain calls read. The whole conversation is loaded when the
        # model is next called, not before the run's first step.
        self.history = list(head.history)
        # The instructions are rendered from the state before each model call.
        self._conversation = Conversation("", self.history) if head.history_from <= 1 else None
        self.last_seq = head.last_seq
        self.make_provider = make_provider
        self.heartbeat: Heartbeat | None = None
        self.deadline = head.deadline
        self.record = RunRecord(head.session_id, agent.name, agent.version, config.worker_id)
        self.state = replay(head, agent)
        # The seq of a tool call this run recorded with the model's answer (one commit)
        # and has not started yet: recorded, but not by a run that crashed.
        self.recorded_now: int | None = None

    # -- writing -------------------------------------------------------------------------
    def append(
        self,
        step: NewStep,
        *,
        checkpoint: bool = False,
        status: SessionStatus | None = None,
        error: str | None = None,
        release: bool = False,
    ) -> StepRecord:
        return self.append_all(
            [step], checkpoint=checkpoint, status=status, error=error, release=release
        )[0]

    def append_all(
        self,
        steps: list[NewStep],
        *,
        checkpoint: bool = False,
        status: SessionStatus | None = None,
        error: str | None = None,
        release: bool = False,
    ) -> list[StepRecord]:
        if self.heartbeat is not None and self.heartbeat.lost.is_set():
            raise LeaseLost(f"session {self.session_id}: heartbeat found the lease fenced off")
        # With a redactor, secrets never reach the store: redact first, then fold the
        # redacted step into the state, so the checkpoint written with it is redacted too.
        if self.config.redactor is not None:
            redact = self.config.redactor.redact
            steps = [replace(s, payload=redact(s.payload)) for s in steps]
        records = [step.at(self.last_seq + 1 + index) for index, step in enumerate(steps)]
        # With a checkpoint, fold first so the checkpoint written with these steps already
        # includes them (and keep the state before, for a failed write). Without one the
        # fold waits for the commit: no copy of the state on every step.
        state_before = None
        new_checkpoint = None
        if checkpoint:
            # Its serialised form, the checkpoint's own format: five times cheaper than a
            # deep copy, and turned back into a state only if the write fails.
            state_before = self.state.to_dict()
            for record in records:
                apply_step(self.state, record)
            new_checkpoint = NewCheckpoint(state=self.state)
        began = time.perf_counter()
        try:
            result = self.store.append(
                self.lease,
                steps,
                checkpoint=new_checkpoint,
                status=status,
                error=error,
                release=release,
            )
        except Exception:
            if state_before is not None:
                self.state = SessionState.from_dict(state_before)
            raise
        if not checkpoint:
            for record in records:
                apply_step(self.state, record)
        expected = [r.seq for r in records]
        if result.seqs != expected:
            # Only the lease holder writes, so seqs are predictable; anything else means
            # someone wrote around the fence.
            raise LeaseLost(
                f"session {self.session_id}: expected seqs {expected}, got {result.seqs}"
            )
        self.last_seq = records[-1].seq
        guarded(
            self.config.telemetry.steps_written,
            self.record,
            [r.kind for r in records],
            time.perf_counter() - began,
            self.last_seq if checkpoint else None,
        )
        self.history.extend(records)
        if self._conversation is not None:
            for record in records:
                self._conversation.add(record)
        if result.cancel_requested and not release:
            self.stop_cancelled()
        return records

    @property
    def conversation(self) -> Conversation:
        """The conversation the model sees, over the whole live history: loaded from the
        store the first time it is needed in a run that started from a tail, then kept up
        to date as steps are appended."""
        if self._conversation is None:
            try:
                history = self.store.load_history(self.session_id)
            except IncompatibleSchemaError as exc:
                # A step before the tail that this code cannot read after all (a payload
                # at the current version but malformed): stop as load_head would have.
                self.store.release(self.lease)
                raise _Stop(
                    RunResult(self.session_id, Outcome.INCOMPATIBLE, error=str(exc))
                ) from exc
            self._conversation = Conversation("", history)
        return self._conversation

    def _scrub(self, text: str) -> str:
        """Keep configured secrets out of recorded errors, whatever a provider raised."""
        for name, value in self.config.provider_options.items():
            if "key" in name and isinstance(value, str) and len(value) >= 8:
                text = text.replace(value, "[redacted]")
        return text

    def stop_cancelled(self) -> None:
        """The cooperative stop: the session's `cancel_requested` flag (set in the admin)
        came back with a heartbeat or an append; the step in hand is recorded, the run ends
        here with a `cancelled` step. (The operator's cancel fences the run off instead.)"""
        self.append(
            system_step(SystemPayload(event=SystemEvent.CANCELLED, worker=self.config.worker_id)),
            checkpoint=False,
            status=SessionStatus.CANCELLED,
            release=True,
        )
        raise _Stop(RunResult(self.session_id, Outcome.CANCELLED))

    def fail(self, where: str, message: str, **details: Any) -> None:
        self.append(
            NewStep(kind=StepKind.ERROR, payload=error_payload(where, message, **details)),
            status=SessionStatus.FAILED,
            error=message,
            release=True,
        )
        raise _Stop(RunResult(self.session_id, Outcome.FAILED, error=message))

    # -- the turn ------------------------------------------------------------------------
    def run(
        self,
        head: SessionHead,
        agent_state: dict[str, Any] | None = None,
        agent_state_upgraders: tuple[str, ...] = (),
    ) -> RunResult:
        payload = run_started(head, worker=self.config.worker_id, agent_version=self.agent.version)
        payload["schema_version"] = head.checkpoint.schema_version if head.checkpoint else None
        payload["upgraders"] = list(head.upgraders_applied)
        # Stored version -> how many of the loaded steps were stored in it.
        payload["step_versions"] = {str(v): n for v, n in sorted(head.step_versions.items())}
        if agent_state is not None:
            # New or upgraded: recorded whole, so every change after it is at its version.
            payload["agent_state"] = agent_state
            payload["agent_state_upgraders"] = list(agent_state_upgraders)
        self.append(system_step(payload, started_at=utcnow()))
        while True:
            if self.heartbeat is not None and self.heartbeat.cancel_requested:
                self.stop_cancelled()
            action = next_action(self.history)
            if isinstance(action, Finished):
                # A run that finds the turn already answered (e.g. a crash after the final
                # step's commit but before the status change cannot happen: they are one
                # transaction) simply settles the status.
                self.append(
                    system_step(SystemPayload(event=SystemEvent.ALREADY_ANSWERED)),
                    checkpoint=True,
                    status=SessionStatus.COMPLETED,
                    release=True,
                )
                return RunResult(self.session_id, Outcome.COMPLETED, final_answer=action.answer)
            if isinstance(action, CallModel):
                answer = self.call_model()
                if answer is not None:
                    return answer
            else:
                paused = self.run_tools(action)
                if paused is not None:
                    return paused

    def check_budgets(self) -> None:
        """Pause the session, with the reason, when it has used up a budget."""
        budgets, counters = self.state.budgets, self.state.counters
        if counters.steps >= budgets.max_steps:
            self.pause_for_budget(
                "steps",
                f"step limit of {budgets.max_steps} reached",
                limit=budgets.max_steps,
                used=counters.steps,
            )
        tokens = counters.tokens_in + counters.tokens_out
        if budgets.max_tokens is not None and tokens >= budgets.max_tokens:
            self.pause_for_budget(
                "tokens",
                f"token limit of {budgets.max_tokens} reached ({tokens} used)",
                limit=budgets.max_tokens,
                used=tokens,
            )
        if budgets.max_cost is not None and counters.cost >= budgets.max_cost:
            self.pause_for_budget(
                "cost",
                f"cost limit of {budgets.max_cost:g} reached ({counters.cost:g} spent)",
                limit=budgets.max_cost,
                used=round(counters.cost, 6),
            )
        if self.deadline is not None and utcnow() >= self.deadline:
            self.pause_for_budget(
                "time",
                f"wall-time limit reached (the deadline was {self.deadline:%Y-%m-%d %H:%M:%S} UTC)",
                limit=self.deadline.isoformat(),
                used=utcnow().isoformat(),
            )

    def pause_for_budget(self, budget: str, message: str, *, limit: Any, used: Any) -> None:
        """A budget is used up: not a failure. The session pauses with the reason (shown
        in "needs attention"); raising the budget and resuming continues it here."""
        error = f"{BUDGET_REACHED}: {message}"
        guarded(self.config.telemetry.budget_reached, self.record, budget)
        self.append(
            system_step(
                SystemPayload(
                    event=SystemEvent.BUDGET_REACHED,
                    budget=budget,
                    limit=limit,
                    used=used,
                    message=message,
                )
            ),
            checkpoint=True,
            status=SessionStatus.PAUSED,
            error=error,
            release=True,
        )
        raise _Stop(RunResult(self.session_id, Outcome.PAUSED, error=error))

    def call_model(self) -> RunResult | None:
        self.check_budgets()
        spec = self.config.model_override or self.agent.model
        try:
            provider, model_name = self.make_provider(spec, self.config.provider_options)
        except (ValueError, ProviderError) as exc:
            self.fail("model", f"cannot use model {spec!r}: {exc}", model=spec, permanent=True)
        settings = ModelSettings(model=model_name, timeout=self.config.model_timeout)
        conversation = self.conversation
        try:
            conversation.system_prompt = self.agent.render_instructions(self.state)
        except Exception as exc:  # the agent's own code: its failure is the session's
            self.fail(
                "agent",
                f"the instructions of agent {self.agent.name!r} raised {type(exc).__name__}: {exc}",
                permanent=True,
            )
        messages = conversation.messages
        started = utcnow()
        call = ModelCallRecord(self.record, spec.partition(":")[0], model_name)
        with observe(self.config.telemetry, "model_call", call):
            turn = self._complete_with_retries(provider, messages, settings, spec)
            usage = usage_record(turn.usage, self.config.prices, spec, model_name)
            call.input_tokens = turn.usage.input_tokens
            call.output_tokens = turn.usage.output_tokens
            call.cache_read_tokens = turn.usage.cache_read_tokens
            call.cache_write_tokens = turn.usage.cache_write_tokens
            call.cost = None if usage.get("unpriced") else usage["cost"]
            call.finish = "tool_calls" if turn.tool_calls else "stop"
        payload = model_payload(turn.text, [c.to_dict() for c in turn.tool_calls], usage, spec)
        step = NewStep(
            kind=StepKind.MODEL,
            payload=payload,
            started_at=started,
            finished_at=utcnow(),
            tokens_in=turn.usage.input_tokens,
            tokens_out=turn.usage.output_tokens,
        )
        if not turn.tool_calls:
            self.append(step, checkpoint=True, status=SessionStatus.COMPLETED, release=True)
            return RunResult(self.session_id, Outcome.COMPLETED, final_answer=turn.text)
        first = self.runs_at_once(turn.tool_calls)
        if first is None:
            self.append(step)
            return None
        # The answer and the record of the call that runs next are known together: one
        # commit. The call's seq and key are what they would be recorded apart (the seq
        # after the answer's), so a crash anywhere leaves a trace a run resumes the same.
        call_seq = self.last_seq + 2
        self.append_all([step, call_step(first, call_key(self.session_id, call_seq))])
        self.recorded_now = call_seq
        return None

    def runs_at_once(self, calls: list[ToolCall]) -> ToolCall | None:
        """The call run_tools records and runs right after the model's answer, if any: the
        first of a sequential turn, unless it waits for a person's approval. (A fan-out
        records its calls together, apart from the answer.)"""
        tool = self.agent.tool_registry.get(calls[0].name)
        if tool is not None and tool.needs_approval:
            return None
        if self.fans_out(calls):
            return None
        return calls[0]

    def _complete_with_retries(
        self, provider: Provider, messages: list[Message], settings: ModelSettings, spec: str
    ) -> ModelTurn:
        limits = self.agent.limits
        retries = (
            limits.max_model_retries
            if limits.max_model_retries is not None
            else self.config.model_retries
        )
        attempt = 0
        error: Exception
        while True:
            attempt += 1
            try:
                return provider.complete(messages, self.agent.tool_registry.specs(), settings)
            except ProviderError as exc:
                error, permanent = exc, exc.permanent
            except Exception as exc:  # an SDK's unexpected error: retry, it may be transient
                error, permanent = exc, False
            if self.heartbeat is not None and self.heartbeat.lost.is_set():
                raise LeaseLost(f"session {self.session_id}: lease lost during the model call")
            if permanent or attempt > retries:
                self.fail(
                    "model",
                    f"model call failed after {attempt} attempt(s): {self._scrub(str(error))}",
                    model=spec,
                    attempts=attempt,
                    permanent=permanent,
                    error_type=type(error).__name__,
                )
            delay = min(
                self.config.model_backoff * (2 ** (attempt - 1)), self.config.model_backoff_max
            )
            log.info(
                "model call for %s failed (%s); retry %d in %.2fs",
                self.session_id,
                error,
                attempt,
                delay,
            )
            time.sleep(delay)

    def fans_out(self, calls: list[ToolCall]) -> bool:
        """Several calls, an agent that allows parallel branches, and nothing a person must
        decide: only tools that may simply run again (idempotent, no approval) fan out, so a
        branch re-run after a crash is as safe as a sequential re-run. (One rule for the
        model's answer, which records a fan-out's calls apart, and for running them.)"""
        if self.agent.limits.max_parallel_tools <= 1 or len(calls) <= 1:
            return False
        for call in calls:
            tool = self.agent.tool_registry.get(call.name)
            if tool is None or tool.needs_approval or not tool.idempotent:
                return False
        return True

    def can_fan_out(self, action: RunTools) -> bool:
        """The turn's calls fan out (fans_out), and none already has a person's decision."""
        if any(pending.decision is not None for pending in action.calls):
            return False
        return self.fans_out([pending.call for pending in action.calls])

    def fan_out(self, action: RunTools) -> RunResult | None:
        """Record every call of the turn (one append) and a `fan_out` step naming them and
        the lease the branches write under; the job enqueues the first wave of branches.

        The lease is not released: the branches heartbeat it while they run and the one
        that records the turn's last result releases it with a checkpoint (the join). If
        every branch is lost, the lease expires, the reconciler runs the session again, and
        this finds the unanswered calls and fans them out anew (a new token fences off
        any branch of the old wave that is still going)."""
        fan_outs = [
            as_system(s.payload)
            for s in self.history
            if s.seq > action.model_seq and s.event == SystemEvent.FAN_OUT
        ]
        limit = self.agent.limits.max_parallel_tools
        new_calls = [p for p in action.calls if p.tool_call_step is None]
        if new_calls:
            now = utcnow()
            self.append_all(
                [
                    NewStep(
                        kind=StepKind.TOOL_CALL,
                        payload=stored(
                            ToolCallPayload(
                                call_id=p.call.id,
                                name=p.call.name,
                                arguments=p.call.arguments,
                                # Which branch of how many: the trace shows them side by side.
                                branch=BranchLabel(index=index + 1, of=len(new_calls)),
                            )
                        ),
                        started_at=now,
                        idempotency_key=call_key(self.session_id, self.last_seq + 1 + index),
                    )
                    for index, p in enumerate(new_calls)
                ]
            )
        recorded = {
            s.call_id: s
            for s in self.history
            if s.seq > action.model_seq and s.kind == StepKind.TOOL_CALL
        }
        calls = [recorded[p.call.id] for p in action.calls]
        # A call dispatched in the first wave of that many fan-outs without ever getting a
        # result keeps killing its worker: the model sees an error instead.
        given_up = []
        for call in calls:
            tries = sum(1 for f in fan_outs if call.seq in f["calls"][: f["limit"]])
            if tries >= self.config.max_branch_attempts:
                given_up.append(call)
        for index, call in enumerate(given_up):
            outcome = ToolOutcome(
                ok=False,
                error=(
                    f"branch gave up: its worker died {self.config.max_branch_attempts} times "
                    "running this call"
                ),
                attempts=0,
                failure="gave_up",
            )
            recorded_call = as_tool_call(call.payload)
            self.record_result(
                ToolCall(
                    recorded_call["call_id"], recorded_call["name"], recorded_call["arguments"]
                ),
                outcome,
                started=utcnow(),
                checkpoint=len(given_up) == len(calls) and index == len(given_up) - 1,
            )
        calls = [c for c in calls if c not in given_up]
        if not calls:
            return None
        seqs = [c.seq for c in calls]
        self.append(
            system_step(
                SystemPayload(
                    event=SystemEvent.FAN_OUT,
                    worker=self.config.worker_id,
                    owner=self.lease.owner,
                    token=self.lease.token,
                    calls=seqs,
                    call_ids=[as_tool_call(c.payload)["call_id"] for c in calls],
                    limit=limit,
                ),
                started_at=utcnow(),
            )
        )
        return RunResult(self.session_id, Outcome.FANNED_OUT, branches=tuple(seqs[:limit]))

    def wait_for_person(self, waiting: SystemPayload) -> RunResult:
        """Stop the run at a call a person must decide on (an approval, an uncertain
        call): checkpointed, the session waits for input."""
        self.append(
            system_step(waiting),
            checkpoint=True,
            status=SessionStatus.WAITING_INPUT,
            release=True,
        )
        return RunResult(self.session_id, Outcome.WAITING_INPUT)

    def run_tools(self, action: RunTools) -> RunResult | None:
        if self.can_fan_out(action):
            return self.fan_out(action)
        remaining = len(action.calls)
        for pending in action.calls:
            remaining -= 1
            call = pending.call
            tool = self.agent.tool_registry.get(call.name)
            boundary = remaining == 0  # the turn's last result: checkpoint with it
            if tool is not None and tool.needs_approval and pending.decision is None:
                return self.wait_for_person(
                    SystemPayload(
                        event=SystemEvent.WAITING_FOR_APPROVAL,
                        call_id=call.id,
                        tool=call.name,
                        arguments=call.arguments,
                        model_seq=action.model_seq,
                        requested_at=utcnow().isoformat(),
                    )
                )
            if pending.decision is not None and pending.decision.action == OperatorAction.REJECT:
                rejection = as_operator(pending.decision.payload)
                reason = rejection.get("reason") or "no reason given"
                actor = rejection.get("actor") or "an operator"
                outcome = ToolOutcome(
                    ok=False, error=f"rejected by {actor}: {reason}", attempts=0, failure="rejected"
                )
                self.record_result(call, outcome, started=utcnow(), checkpoint=boundary)
                continue
            resolution = uncertain_resolution(pending)
            # Recorded with the model's answer by this very run, moments ago: not started,
            # so not uncertain, whatever the tool.
            recorded_now = (
                pending.tool_call_step is not None
                and pending.tool_call_step.seq == self.recorded_now
            )
            self.recorded_now = None
            if (
                pending.tool_call_step is not None
                and not recorded_now
                and tool is not None
                and not tool.idempotent
            ):
                if resolution is None:
                    # It may or may not have happened, and running it again could do it
                    # twice: a person decides (run again, record what happened, or fail).
                    return self.wait_for_person(
                        SystemPayload(
                            event=SystemEvent.UNCERTAIN_CALL,
                            call_id=call.id,
                            tool=call.name,
                            arguments=call.arguments,
                            tool_call_seq=pending.tool_call_step.seq,
                            idempotency_key=pending.tool_call_step.idempotency_key,
                        )
                    )
                if resolution.get("action") == OperatorAction.RECORD_RESULT:
                    outcome = ToolOutcome(ok=True, output=resolution.get("output"), attempts=0)
                    self.record_result(
                        call,
                        outcome,
                        started=utcnow(),
                        checkpoint=boundary,
                        recorded_by=resolution.get("actor") or "an operator",
                    )
                    continue
                # "rerun": a person said it did not happen; run it again with its key.
            if pending.tool_call_step is not None:
                # Recorded with the answer, or before a crash with its result never
                # committed: run (again) with the same key.
                key = recorded_key(self.session_id, pending.tool_call_step)
                call_seq = pending.tool_call_step.seq
            else:
                call_seq = self.last_seq + 1
                key = call_key(self.session_id, call_seq)
                self.append(call_step(call, key))
            started = utcnow()
            if tool is None:
                known = ", ".join(self.agent.tool_registry.names()) or "none"
                outcome = ToolOutcome(
                    ok=False,
                    error=f"unknown tool {call.name!r} (available: {known})",
                    failure="tool",
                )
                self.record_result(call, outcome, started=started, checkpoint=boundary)
                continue
            self.run_tool(tool, call, key=key, call_seq=call_seq, boundary=boundary)
        return None

    def run_tool(
        self, tool: Tool, call: ToolCall, *, key: str, call_seq: int, boundary: bool
    ) -> None:
        """Run a recorded call and record its result. Each attempt starts only while the
        run still holds its lease; a non-idempotent call started by a run that then lost
        the session is reported (report_late_call), and the run stops."""
        started = utcnow()
        begun: list[int] = []  # attempts that were allowed to start
        held_back: list[int] = []  # an attempt not started: the lease was gone

        def context(attempt: int) -> ToolContext:
            if self.heartbeat is not None:
                try:
                    self.heartbeat.ensure()
                except LeaseLost:
                    held_back.append(attempt)
                    raise
            begun.append(attempt)
            return tool_context(
                store=self.store,
                lease=self.lease,
                heartbeat=self.heartbeat,
                agent=self.agent,
                state=self.state,
                effects=self.effects,
                records=self.records,
                options=self.config.tool_options,
                call_id=call.id,
                seq=call_seq,
                key=key,
                attempt=attempt,
            )

        ran: ToolOutcome | None = None
        observed = ToolCallRecord(self.record, call.name, call.id)
        try:
            with observe(self.config.telemetry, "tool_call", observed):
                ran = tool.run(context, call.arguments, self.config.transient)
                observed.ok, observed.error, observed.attempts = ran.ok, ran.error, ran.attempts
            self.record_result(call, ran, started=started, checkpoint=boundary)
        except LeaseLost as exc:
            guarded(self.config.telemetry.fenced, self.record, "tool_call")
            if begun and not tool.idempotent:
                # A call started, and the session is someone else's now: whatever it did
                # is not in the trace. Said out loud, never hidden.
                report_late_call(
                    self.store,
                    self.lease,
                    worker=self.config.worker_id,
                    call=call,
                    tool_call_seq=call_seq,
                    idempotency_key=key,
                    refused=ran is None and not held_back,
                    reason=str(exc),
                )
            raise

    def record_result(
        self,
        call: ToolCall,
        outcome: ToolOutcome,
        *,
        started: Any,
        checkpoint: bool,
        recorded_by: str | None = None,
    ) -> None:
        payload = result_payload(call, outcome, recorded_by=recorded_by)
        self.append(
            NewStep(
                kind=StepKind.TOOL_RESULT, payload=payload, started_at=started, finished_at=utcnow()
            ),
            checkpoint=checkpoint,
        )


def usage_record(usage: Usage, prices: PriceTable, spec: str, model: str) -> UsagePayload:
    """A model step's `usage`: its tokens, cache tokens and cost. A call the price table
    has no price for (and whose provider reported none) is marked `unpriced`."""
    provider = spec.partition(":")[0]
    cost = prices.cost(provider, model, usage)
    record = UsagePayload(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cost=round(cost or 0.0, 8),
    )
    if usage.cache_read_tokens:
        record["cache_read_tokens"] = usage.cache_read_tokens
    if usage.cache_write_tokens:
        record["cache_write_tokens"] = usage.cache_write_tokens
    if cost is None:
        record["unpriced"] = True
    return record


def result_payload(
    call: ToolCall,
    outcome: ToolOutcome,
    *,
    branch: BranchLabel | None = None,
    recorded_by: str | None = None,
) -> dict[str, Any]:
    """The tool_result payload of a call's outcome, with the state changes it carries."""
    payload = outcome.payload(call.id, call.name)
    if outcome.plan_update is not None:
        payload["plan_update"] = [
            PlanUpdateItem(title=title, status=status) for title, status in outcome.plan_update
        ]
    if outcome.memory_added:
        payload["memory_added"] = list(outcome.memory_added)
    if outcome.batch_cursor is not None:
        payload["batch_cursor"] = dict(outcome.batch_cursor)
    if outcome.ok and outcome.agent_state is not None:
        payload["agent_state"] = outcome.agent_state
    if branch is not None:
        payload["branch"] = branch
    if recorded_by is not None:
        # Not the tool's word: a person recorded what happened. Marked, and shown to the
        # model as an operator's record.
        payload["recorded_by_operator"] = recorded_by
    return stored(payload)


def report_late_call(
    store: SessionStore,
    lease: Lease,
    *,
    worker: str,
    call: ToolCall,
    tool_call_seq: int,
    idempotency_key: str,
    refused: bool,
    reason: str,
) -> None:
    """Report a non-idempotent call that a run fenced off had started (the store keeps it
    outside the trace, and the worker's log says it too)."""
    effect = "refused" if refused else "may have happened"
    log.warning(
        "session %s: %s (call %s, seq %s) was started by this run, which then lost the "
        "session (%s); its effect %s",
        lease.session_id,
        call.name,
        call.id,
        tool_call_seq,
        reason,
        "was refused by the fence" if refused else "may have happened: not in the trace",
    )
    report = getattr(store, "report_late_call", None)
    if report is None:
        return
    try:
        report(
            lease,
            {
                "worker": worker,
                "call_id": call.id,
                "tool": call.name,
                "arguments": call.arguments,
                "tool_call_seq": tool_call_seq,
                "idempotency_key": idempotency_key,
                "token": lease.token,
                "effect": effect,
                "reason": reason,
            },
        )
    except Exception:  # the log line above is the report of last resort
        log.exception("session %s: the late call could not be recorded", lease.session_id)


def call_step(call: ToolCall, key: str) -> NewStep:
    """The record of a call about to run. The key lives in the step's own column: it is
    derived from the seq, and payloads stay identical between a resumed and a straight
    run."""
    return NewStep(
        kind=StepKind.TOOL_CALL,
        payload=stored(ToolCallPayload(call_id=call.id, name=call.name, arguments=call.arguments)),
        started_at=utcnow(),
        idempotency_key=key,
    )


def call_key(session_id: str, seq: int) -> str:
    """A tool call's idempotency key: derived from its step's seq, so a run that calls it
    again after a crash passes the same key."""
    return f"{session_id}:{seq}"


def recorded_key(session_id: str, step: StepRecord) -> str:
    """The idempotency key of a recorded tool_call step (steps older than the column: its
    seq's)."""
    return step.idempotency_key or call_key(session_id, step.seq)


def tool_context(
    *,
    store: SessionStore,
    lease: Lease,
    heartbeat: Heartbeat | None,
    agent: Agent,
    state: SessionState,
    effects: EffectLedger,
    records: RecordSource | None,
    options: dict[str, Any],
    call_id: str,
    seq: int,
    key: str,
    attempt: int,
) -> ToolContext:
    """The context of one attempt at the recorded call at `seq`, in a run or a fan-out
    branch (both under `lease`)."""
    return ToolContext(
        session_id=lease.session_id,
        call_id=call_id,
        seq=seq,
        idempotency_key=key,
        attempt=attempt,
        effects=effects,
        options=options,
        records=records,
        agent_name=agent.name,
        agent_version=agent.version,
        # An agent that keeps no state sees none, even where a version of it that kept
        # some recorded it in the session.
        agent_state=state.agent_state if agent.state is not None else None,
        progress=progress_sink(store, lease),
        fence_token=lease.token,
        fence=fence_guard(store, lease, heartbeat),
    )


def progress_sink(store: SessionStore, lease: Lease) -> Callable[[int, int | None, str], bool]:
    """Where a tool's `report_progress` goes: the session row, fenced on the run's lease."""

    def report(done: int, total: int | None, message: str) -> bool:
        try:
            return store.report_progress(lease, done=done, total=total, message=message)
        except Exception:  # progress is a courtesy: a failed write must not fail the tool
            log.warning("progress of %s not recorded", lease.session_id, exc_info=True)
            return True

    return report


def run_session(
    session_id: str,
    *,
    store: SessionStore,
    agents: AgentRegistry,
    effects: EffectLedger,
    config: RunConfig,
    make_provider: ProviderFactory = default_make_provider,
    records: RecordSource | None = None,
) -> RunResult:
    """Advance one session as far as it goes: to an answer, a pause, a failure or a cancel."""
    claimed_at = time.monotonic()  # the lease lasts at least the TTL from here
    lease = store.claim(session_id, config.worker_id, config.lease_ttl)
    if lease is None:
        log.info("session %s: not claimed (leased elsewhere or not runnable)", session_id)
        return RunResult(session_id, Outcome.NOT_CLAIMED)
    try:
        return _claimed(
            session_id,
            lease,
            claimed_at,
            store=store,
            agents=agents,
            effects=effects,
            config=config,
            make_provider=make_provider,
            records=records,
        )
    except Exception as exc:
        if config.is_store_fault is None or not config.is_store_fault(exc):
            raise
        return _release_after_store_fault(session_id, lease, exc, store=store, config=config)


def _release_after_store_fault(
    session_id: str, lease: Lease, fault: Exception, *, store: SessionStore, config: RunConfig
) -> RunResult:
    """The store failed under the run (the database down, its disk full, a write that timed
    out). Not the session's fault and no crash: release the lease, retrying while the
    store keeps failing, for up to `store_fault_patience` seconds, so that the next claim
    is not a takeover. Then the reconciler dispatches the session again. A store that is
    still failing after that lets the lease expire (and that takeover counts)."""
    log.warning("session %s: the store failed under the run (%s); releasing", session_id, fault)
    is_fault = config.is_store_fault
    assert is_fault is not None  # how we got here
    deadline = time.monotonic() + config.store_fault_patience
    delay = 0.5
    while True:
        try:
            store.release(lease)
            break
        except Exception as again:
            if not is_fault(again) or time.monotonic() + delay > deadline:
                raise fault from again
            time.sleep(delay)
            delay = min(delay * 2, 10.0)
    return RunResult(session_id, Outcome.STORE_FAULT, error=f"{type(fault).__name__}: {fault}")


def _claimed(
    session_id: str,
    lease: Lease,
    claimed_at: float,
    *,
    store: SessionStore,
    agents: AgentRegistry,
    effects: EffectLedger,
    config: RunConfig,
    make_provider: ProviderFactory,
    records: RecordSource | None,
) -> RunResult:
    """run_session once the lease is held."""
    try:
        head = store.load_tail(session_id)
    except IncompatibleSchemaError as exc:
        store.release(lease)
        return RunResult(session_id, Outcome.INCOMPATIBLE, error=str(exc))
    try:
        agent = agents.get(head.agent_name)
    except UnknownAgent as exc:
        # Not the session's fault: the code that runs it is missing here (removed from
        # RESPAWN_AGENTS, or a worker left on other code). Nothing is written; the session
        # is marked and waits for a worker that has the agent.
        store.release(lease)
        return RunResult(
            session_id,
            Outcome.INCOMPATIBLE,
            error=f"{exc} on this worker (is it in RESPAWN_AGENTS or an installed package?)",
        )
    if lease.crashes >= config.max_crashes:
        message = (
            f"the worker died {lease.crashes} times in a row at step {head.last_seq} without "
            "writing a step; not running it again (a poison session). Fix the cause, then resume."
        )
        store.append(
            lease,
            [
                NewStep(
                    kind=StepKind.ERROR,
                    payload=error_payload("worker", message, crashes=lease.crashes),
                )
            ],
            status=SessionStatus.FAILED,
            error=message,
            release=True,
        )
        return RunResult(session_id, Outcome.FAILED, error=message)
    if agent.runner is not None:
        # A foreign turn loop (agent_runtime.runners): the lease, the run_started step, the
        # heartbeat and the closing status stay the engine's.
        return run_with_runner(store=store, agent=agent, config=config, lease=lease, head=head)
    try:
        run = _Run(
            store=store,
            agent=agent,
            effects=effects,
            config=config,
            lease=lease,
            head=head,
            make_provider=make_provider,
            records=records,
        )
        refusal = agent.refusal(started=head.agent_version, last_ran=run.state.agent_version)
        if refusal is not None:
            raise AgentStateError(refusal)
        agent_state, upgraders = start_agent_state(agent, run.state)
    except (StateError, AgentStateError) as exc:
        store.release(lease)
        return RunResult(session_id, Outcome.INCOMPATIBLE, error=str(exc))
    record = run.record
    if lease.crashes > 0:
        # A takeover of an expired lease: the run before died (or froze) mid-turn.
        record.recovering = True
        record.recovery_seconds = _since_last_step(head)
    with observe(config.telemetry, "run", record):
        try:
            with Heartbeat(
                store, lease, config.lease_ttl, config.heartbeat_every, since=claimed_at
            ) as heartbeat:
                run.heartbeat = heartbeat
                result = run.run(head, agent_state, upgraders)
        except _Stop as stop:
            result = stop.result
        except LeaseLost as exc:
            log.warning("session %s: %s; stopping without writing", session_id, exc)
            came_back(store, lease)
            guarded(config.telemetry.fenced, record, "append")
            result = RunResult(session_id, Outcome.LEASE_LOST, error=str(exc))
        record.outcome, record.error = result.outcome.value, result.error
    return result


def _since_last_step(head: SessionHead) -> float | None:
    """Seconds from the last durable step of `head` to now (None: no step has a time)."""
    for step in reversed(head.history):
        stamp = step.finished_at or step.started_at
        if stamp is not None:
            return max(0.0, (utcnow() - stamp).total_seconds())
    return None
