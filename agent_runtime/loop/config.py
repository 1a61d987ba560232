"""What a run is given and what it returns: its configuration (`RunConfig`), how it ended
(`Outcome`, `RunResult`) and the step every run records first (`run_started`). Shared by the
engine's own loop (`run`) and a foreign runner's run (`foreign`)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..pricing import PriceTable, load_price_table
from ..providers import Provider
from ..redaction import Redactor
from ..state import SystemEvent, SystemPayload
from ..store import SessionHead
from ..telemetry import NO_TELEMETRY, Telemetry
from ..tools import TransientRetry

ProviderFactory = Callable[[str, dict[str, Any]], tuple[Provider, str]]

# How the error of a session paused by a budget starts (the dashboard's "needs attention"
# finds them by it).
BUDGET_REACHED = "budget reached"


@dataclass(frozen=True)
class RunConfig:
    worker_id: str
    lease_ttl: float = 10.0
    heartbeat_interval: float | None = None  # default: a third of the lease TTL
    model_retries: int = 3
    model_backoff: float = 0.5
    model_backoff_max: float = 8.0
    model_timeout: float = 60.0
    model_override: str | None = None  # RESPAWN_MODEL: replaces every agent's model
    provider_options: dict[str, Any] = field(default_factory=dict)
    tool_options: dict[str, Any] = field(default_factory=dict)
    # Applied to every payload (and so every state) before it is stored, for a store that
    # keeps secrets in the clear (Respawn's Django store seals them instead, exactly).
    redactor: Redactor | None = None
    # Fail a session whose worker died this many times in a row at the same step.
    max_crashes: int = 5
    # Whether an exception is the store's infrastructure failing (not the session's own
    # data): the run then releases its lease, retrying for up to `store_fault_patience`
    # seconds, so that a fault of minutes counts no crash (None: no exception is).
    is_store_fault: Callable[[BaseException], bool] | None = None
    store_fault_patience: float = 300.0
    # A fan-out branch dispatched this many times without a result (its worker kept dying)
    # gets an error result the model sees instead of another try.
    max_branch_attempts: int = 3
    # What model calls cost when their provider does not say (agent_runtime.pricing).
    prices: PriceTable = field(default_factory=lambda: load_price_table(""))
    # Where runs, model and tool calls and writes are reported (agent_runtime.telemetry).
    telemetry: Telemetry = NO_TELEMETRY
    # How a tool call that failed on the infrastructure (database, Redis, network) is
    # retried, and which errors count as such.
    transient: TransientRetry = field(default_factory=TransientRetry)

    @property
    def heartbeat_every(self) -> float:
        """Seconds between heartbeats: `heartbeat_interval`, or a third of the lease TTL."""
        return self.heartbeat_interval or max(self.lease_ttl / 3, 0.05)


class Outcome(enum.StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    WAITING_INPUT = "waiting_input"
    CANCELLED = "cancelled"
    LEASE_LOST = "lease_lost"
    NOT_CLAIMED = "not_claimed"
    INCOMPATIBLE = "incompatible"
    # A budget was reached: paused with the reason until someone raises it and resumes.
    PAUSED = "paused"
    # The turn's tool calls were handed to branch jobs; `RunResult.branches` says which.
    FANNED_OUT = "fanned_out"
    # The store failed under the run (the database down, full, or a write timed out): the
    # lease was released, nothing counts as a crash, the next dispatch runs it again.
    STORE_FAULT = "store_fault"


@dataclass(frozen=True)
class RunResult:
    session_id: str
    outcome: Outcome
    final_answer: str | None = None
    error: str | None = None
    branches: tuple[int, ...] = ()  # FANNED_OUT: seqs of the tool calls to run as branch jobs


def run_started(head: SessionHead, *, worker: str, agent_version: str) -> SystemPayload:
    """What every run records first: what it loaded, and the agent version running it
    beside the one the session started on."""
    return SystemPayload(
        event=SystemEvent.RUN_STARTED,
        worker=worker,
        checkpoint_seq=head.checkpoint.seq if head.checkpoint else None,
        steps_after_checkpoint=len(head.steps_after_checkpoint),
        agent_version=agent_version,
        agent_started_on=head.agent_version or None,
    )
