"""The storage protocol the loop talks through, and an in-memory implementation.

The Django implementation lives in `sessions_app/store.py`; both pass the same contract
tests (`tests/contract/`). Methods take ids and engine dataclasses, never ORM rows.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from .state import (
    RUNNABLE_STATUSES,
    CheckpointRecord,
    NewCheckpoint,
    NewStep,
    SessionStatus,
    StepKind,
    StepRecord,
    as_model,
    user_payload,
    validate_step_payload,
)


class StoreError(Exception):
    pass


class SessionNotFound(StoreError):
    pass


class LeaseLost(StoreError):
    """The fencing token no longer matches: another worker (or an operator) took over."""


@dataclass(frozen=True)
class Lease:
    session_id: str
    owner: str
    token: int
    # Takeovers in a row of an expired lease with no step written in between: how many
    # times a worker died at this point. A poison session is failed once it reaches the
    # configured limit instead of crashing workers forever.
    crashes: int = 0


@dataclass(frozen=True)
class SessionHead:
    """What a run starts from: the head checkpoint and the live (non-superseded) history."""

    session_id: str
    agent_name: str
    status: SessionStatus
    head_seq: int
    last_seq: int
    checkpoint: CheckpointRecord | None
    history: list[StepRecord]
    upgraders_applied: tuple[str, ...] = ()  # applied to the checkpoint state
    step_versions: dict[int, int] = field(default_factory=dict)  # stored version -> steps
    # The first seq `history` holds: 1 when it is all of it (load_head), later for the
    # tail load_tail returns (every live step from this seq on).
    history_from: int = 1
    # The agent version the session started on ("" when it was not recorded).
    agent_version: str = ""
    # The wall-time budget: when the session must be done by (None: no limit). Kept on the
    # session row, not in the state, so an operator can move it without a new checkpoint.
    deadline: datetime | None = None

    @property
    def steps_after_checkpoint(self) -> list[StepRecord]:
        return [s for s in self.history if s.seq > self.head_seq]


def tail_start(history: Sequence[StepRecord], head_seq: int) -> int:
    """Where the steps a run starts from begin: at the last model step (what the run does
    next is decided from it and the steps after it), or just after the head checkpoint if
    that is earlier (those steps are folded into the checkpoint's state). 1 (everything)
    when there is no model step yet."""
    last_model = max((s.seq for s in history if s.kind == StepKind.MODEL), default=None)
    return tail_start_at(last_model, head_seq)


def tail_start_at(last_model_seq: int | None, head_seq: int) -> int:
    """tail_start from the seq of the last live model step (None: there is none), for a
    store that finds it with a query instead of in a loaded history."""
    return 1 if last_model_seq is None else min(last_model_seq, head_seq + 1)


def tail_of(head: SessionHead) -> SessionHead:
    """A whole-history head cut down to what load_tail returns."""
    start = tail_start(head.history, head.head_seq)
    return replace(head, history=[s for s in head.history if s.seq >= start], history_from=start)


@dataclass(frozen=True)
class AppendResult:
    seqs: list[int]
    cancel_requested: bool


@dataclass(frozen=True)
class BranchAppend:
    seq: int | None  # the result's seq; None when the call had a result already
    unanswered: int  # calls of the turn still without a result, after this one


@dataclass(frozen=True)
class HeartbeatResult:
    alive: bool
    cancel_requested: bool


class SessionStore(Protocol):
    def claim(self, session_id: str, owner: str, ttl: float) -> Lease | None:
        """Take the session's lease if it is free or expired and the session is runnable."""

    def load_head(self, session_id: str) -> SessionHead:
        """The head checkpoint and the live history, upgraded to the current schema.

        Raises IncompatibleSchemaError (naming the checkpoint or step) when any of it cannot
        be loaded by this code; nothing is written then.
        """

    def load_tail(self, session_id: str) -> SessionHead:
        """What a run starts from without the whole history: `load_head` with only the
        live steps from `tail_start` on (`history_from` says where they begin); the
        step counts by stored version are still those of every live step.

        Raises IncompatibleSchemaError like load_head for the checkpoint, the steps it
        returns, and any live step stored at a schema version this code cannot load;
        nothing is written then. (A step at the current version whose payload is
        malformed is found when the rest is loaded, by load_history.)
        """

    def load_history(self, session_id: str) -> list[StepRecord]:
        """The whole live history, upgraded: what load_head returns as `history`."""

    def append(
        self,
        lease: Lease,
        steps: Sequence[NewStep],
        *,
        checkpoint: NewCheckpoint | None = None,
        status: SessionStatus | None = None,
        error: str | None = None,
        release: bool = False,
        final_answer: str | None = None,
    ) -> AppendResult:
        """Append steps (and a checkpoint at the last one) in one transaction, fenced.
        Payloads must have the current schema version's shape (StateError otherwise).
        The session's final answer is the checkpoint's, or `final_answer` when a run
        that keeps no Respawn state (a foreign runner's) ends with one.

        Raises LeaseLost when the lease's token is no longer the session's.
        """

    def append_branch_result(
        self, lease: Lease, step: NewStep, *, call_id: str, after_seq: int
    ) -> BranchAppend:
        """Append a fan-out branch's tool_result, fenced like `append`, unless the call
        already has a live result after the model step at `after_seq` (then nothing is
        written). Counts the turn's calls still unanswered in the same transaction, under
        the session row's lock, so exactly one branch sees the count reach zero.

        Raises LeaseLost when the lease's token is no longer the session's.
        """

    def heartbeat(self, lease: Lease, ttl: float) -> HeartbeatResult:
        """Extend the lease; alive=False once another holder fenced this one off."""

    def release(self, lease: Lease) -> bool:
        """Give the lease up without writing anything else."""

    def came_back(self, lease: Lease) -> bool:
        """The run that held `lease` found it taken over while it was still alive (stopped,
        or paused past its TTL): the takeover right after it counted a crash that was not
        one, and that count is taken back. Only a takeover of this very lease (the next
        fencing token, held by someone else) is; returns whether it was."""

    def report_progress(self, lease: Lease, *, done: int, total: int | None, message: str) -> bool:
        """Show how far a running tool got (on the session, not in the trace), fenced;
        returns False when the lease is no longer this holder's."""

    def fenced(self, lease: Lease) -> contextlib.AbstractContextManager[None]:
        """Hold the session's fence while a tool writes: raises LeaseLost at once when the
        lease is no longer this holder's; otherwise nobody can take the lease over until
        the block ends, and the writes made in it (on the store's database, in this
        thread) commit with that check or not at all."""

    def report_late_call(self, lease: Lease, report: dict[str, Any]) -> None:
        """Record, outside the trace (which belongs to whoever holds the session now),
        that a run fenced off had started a non-idempotent tool call: what it was and
        whether its effect was refused or may have happened."""


class EffectLedger(Protocol):
    """Where demo tools leave their externally visible side effects, keyed for idempotency."""

    def record(self, key: str, *, session_id: str, tool: str, payload: dict[str, Any]) -> bool:
        """Record the effect once per key; returns False when the key was already there."""


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class _MemSession:
    session_id: str
    agent_name: str
    status: SessionStatus
    agent_version: str = ""
    head: int = 0
    last_seq: int = 0
    fencing_token: int = 0
    lease_owner: str | None = None
    lease_expires: float = 0.0
    cancel_requested: bool = False
    last_error: str | None = None
    final_answer: str | None = None
    crash_count: int = 0
    crash_seq: int = -1
    progress: tuple[int, int | None, str] | None = None
    deadline: datetime | None = None
    steps: list[StepRecord] = field(default_factory=list)
    checkpoints: list[CheckpointRecord] = field(default_factory=list)
    # Non-idempotent calls started by runs that were fenced off (report_late_call).
    late_calls: list[dict[str, Any]] = field(default_factory=list)


class InMemoryStore:
    """A SessionStore for engine tests: same semantics as the Django store, in a dict."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._sessions: dict[str, _MemSession] = {}
        self._lock = threading.RLock()
        self._clock = clock

    # -- helpers for tests and callers that play the sessions_app role -------------------
    def create_session(
        self,
        session_id: str,
        agent_name: str,
        user_input: str,
        agent_version: str = "",
        deadline: datetime | None = None,
    ) -> None:
        with self._lock:
            session = _MemSession(
                session_id,
                agent_name,
                SessionStatus.QUEUED,
                agent_version=agent_version,
                deadline=deadline,
            )
            session.steps.append(
                StepRecord(
                    seq=1, kind=StepKind.USER, payload=user_payload(user_input), started_at=utcnow()
                )
            )
            session.last_seq = 1
            self._sessions[session_id] = session

    def add_operator_step(
        self, session_id: str, payload: dict[str, Any], status: SessionStatus | None = None
    ) -> int:
        """Append an out-of-band step (a person's decision) and fence off any holder."""
        with self._lock:
            session = self._get(session_id)
            session.last_seq += 1
            session.steps.append(
                StepRecord(seq=session.last_seq, kind=StepKind.OPERATOR, payload=payload)
            )
            if status is not None:
                session.status = status
            session.fencing_token += 1
            session.lease_owner = None
            return session.last_seq

    def add_user_message(self, session_id: str, text: str) -> int:
        """A new user message to a session (queued for a run), as sessions_app's
        send-message does."""
        with self._lock:
            session = self._get(session_id)
            session.last_seq += 1
            session.steps.append(
                StepRecord(seq=session.last_seq, kind=StepKind.USER, payload=user_payload(text))
            )
            session.status = SessionStatus.QUEUED
            return session.last_seq

    def request_cancel(self, session_id: str) -> None:
        with self._lock:
            self._get(session_id).cancel_requested = True

    def expire_lease(self, session_id: str) -> None:
        with self._lock:
            self._get(session_id).lease_expires = 0.0

    def session(self, session_id: str) -> _MemSession:
        with self._lock:
            return self._get(session_id)

    # -- SessionStore --------------------------------------------------------------------
    def _get(self, session_id: str) -> _MemSession:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise SessionNotFound(session_id) from None

    def claim(self, session_id: str, owner: str, ttl: float) -> Lease | None:
        with self._lock:
            session = self._get(session_id)
            now = self._clock()
            if session.status not in RUNNABLE_STATUSES:
                return None
            if session.lease_owner is not None and session.lease_expires > now:
                return None
            if session.lease_owner is None:
                session.crash_count = 0  # released cleanly, or freed by a person
            else:
                # A run writes its run_started step first; only steps after it are progress.
                progressed = session.last_seq > session.crash_seq + 1
                session.crash_count = 1 if progressed else session.crash_count + 1
                session.crash_seq = session.last_seq
            session.fencing_token += 1
            session.lease_owner = owner
            session.lease_expires = now + ttl
            session.status = SessionStatus.RUNNING
            return Lease(session_id, owner, session.fencing_token, crashes=session.crash_count)

    def load_head(self, session_id: str) -> SessionHead:
        from .upgraders import IncompatibleSchemaError, load_state, load_step_payload

        with self._lock:
            session = self._get(session_id)
            checkpoint = next((c for c in session.checkpoints if c.seq == session.head), None)
            applied: tuple[str, ...] = ()
            if checkpoint is not None:
                # Round-trip through the serialised form, as a real store would.
                try:
                    loaded = load_state(checkpoint.state.to_dict())
                except IncompatibleSchemaError as exc:
                    raise exc.at(f"checkpoint at seq {checkpoint.seq}") from exc
                applied = loaded.applied
                checkpoint = replace(checkpoint, state=loaded.value)
            history = []
            versions: dict[int, int] = {}
            for step in session.steps:
                if step.superseded:
                    continue
                try:
                    payload = load_step_payload(step.kind, step.payload, step.schema_version)
                except IncompatibleSchemaError as exc:
                    raise exc.at(f"step seq {step.seq} ({step.kind})") from exc
                versions[step.schema_version] = versions.get(step.schema_version, 0) + 1
                history.append(replace(step, payload=payload.value))
            return SessionHead(
                session_id=session_id,
                agent_name=session.agent_name,
                status=session.status,
                head_seq=session.head,
                last_seq=session.last_seq,
                checkpoint=checkpoint,
                history=history,
                upgraders_applied=applied,
                step_versions=versions,
                agent_version=session.agent_version,
                deadline=session.deadline,
            )

    def load_tail(self, session_id: str) -> SessionHead:
        return tail_of(self.load_head(session_id))

    def load_history(self, session_id: str) -> list[StepRecord]:
        return self.load_head(session_id).history

    def _check(self, session: _MemSession, lease: Lease) -> None:
        if session.fencing_token != lease.token or session.lease_owner != lease.owner:
            raise LeaseLost(f"session {lease.session_id}: lease token {lease.token} was fenced off")

    def append(
        self,
        lease: Lease,
        steps: Sequence[NewStep],
        *,
        checkpoint: NewCheckpoint | None = None,
        status: SessionStatus | None = None,
        error: str | None = None,
        release: bool = False,
        final_answer: str | None = None,
    ) -> AppendResult:
        with self._lock:
            session = self._get(lease.session_id)
            self._check(session, lease)
            for step in steps:
                validate_step_payload(step.kind, step.payload)
            seqs = []
            for step in steps:
                session.last_seq += 1
                seqs.append(session.last_seq)
                # A copy of the payload, as a real store serialises it.
                session.steps.append(replace(step, payload=dict(step.payload)).at(session.last_seq))
            if checkpoint is not None:
                # A copy, as a real store serialises it: the loop goes on mutating its state.
                session.checkpoints.append(
                    CheckpointRecord(
                        seq=session.last_seq,
                        state=copy.deepcopy(checkpoint.state),
                        reason=checkpoint.reason,
                    )
                )
                session.head = session.last_seq
                if checkpoint.state.final_answer is not None:
                    session.final_answer = checkpoint.state.final_answer
            if final_answer is not None:
                session.final_answer = final_answer
            if status is not None:
                session.status = status
            if error is not None:
                session.last_error = error
            if release:
                session.lease_owner = None
            return AppendResult(seqs=seqs, cancel_requested=session.cancel_requested)

    def append_branch_result(
        self, lease: Lease, step: NewStep, *, call_id: str, after_seq: int
    ) -> BranchAppend:
        with self._lock:
            session = self._get(lease.session_id)
            self._check(session, lease)
            live = [s for s in session.steps if not s.superseded and s.seq >= after_seq]
            model = next((s for s in live if s.seq == after_seq), None)
            calls = (
                {c["id"] for c in as_model(model.payload).get("tool_calls") or []}
                if model
                else set()
            )
            answered = {s.call_id for s in live if s.kind == StepKind.TOOL_RESULT} & calls
            if call_id in answered:
                return BranchAppend(seq=None, unanswered=len(calls - answered))
            seq = self.append(lease, [step]).seqs[0]
            return BranchAppend(seq=seq, unanswered=len(calls - answered - {call_id}))

    def heartbeat(self, lease: Lease, ttl: float) -> HeartbeatResult:
        with self._lock:
            session = self._get(lease.session_id)
            if session.fencing_token != lease.token or session.lease_owner != lease.owner:
                return HeartbeatResult(alive=False, cancel_requested=session.cancel_requested)
            session.lease_expires = self._clock() + ttl
            return HeartbeatResult(alive=True, cancel_requested=session.cancel_requested)

    def release(self, lease: Lease) -> bool:
        with self._lock:
            session = self._get(lease.session_id)
            if session.fencing_token != lease.token or session.lease_owner != lease.owner:
                return False
            session.lease_owner = None
            return True

    def came_back(self, lease: Lease) -> bool:
        with self._lock:
            session = self._get(lease.session_id)
            taken = session.lease_owner not in (None, lease.owner)
            if not taken or session.fencing_token != lease.token + 1 or not session.crash_count:
                return False
            session.crash_count -= 1
            return True

    def report_progress(self, lease: Lease, *, done: int, total: int | None, message: str) -> bool:
        with self._lock:
            session = self._get(lease.session_id)
            if session.fencing_token != lease.token or session.lease_owner != lease.owner:
                return False
            session.progress = (done, total, message)
            return True

    @contextlib.contextmanager
    def fenced(self, lease: Lease) -> Iterator[None]:
        # The store's lock is the fence: no claim or operator step gets in meanwhile.
        with self._lock:
            self._check(self._get(lease.session_id), lease)
            yield

    def report_late_call(self, lease: Lease, report: dict[str, Any]) -> None:
        with self._lock:
            self._get(lease.session_id).late_calls.append({"owner": lease.owner, **report})


class InMemoryEffects:
    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}
        self.attempts: dict[str, int] = {}
        self._lock = threading.Lock()

    def record(self, key: str, *, session_id: str, tool: str, payload: dict[str, Any]) -> bool:
        with self._lock:
            self.attempts[key] = self.attempts.get(key, 0) + 1
            if key in self.rows:
                return False
            self.rows[key] = {"session_id": session_id, "tool": tool, "payload": payload}
            return True
