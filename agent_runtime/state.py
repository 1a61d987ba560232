"""The state a checkpoint carries, and the step records of the trace.

Versions of the stored shape (one line each; a released version is never changed):
  1: plan, memory refs, counters, budgets, pending approval, uncertain calls, batch cursor,
     agent name/version, final answer. Step payloads: see `StepKind` and `upgraders.py`.

The message history is not part of the state: it is the session's steps.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

SCHEMA_VERSION = 1


class StateError(ValueError):
    """A stored blob does not have the shape its schema version promises."""


class StepKind(enum.StrEnum):
    USER = "user"
    MODEL = "model"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"
    ERROR = "error"
    OPERATOR = "operator"
    SYSTEM = "system"


class SessionStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING_INPUT = "waiting_input"
    PAUSED = "paused"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


RUNNABLE_STATUSES = frozenset({SessionStatus.QUEUED, SessionStatus.RUNNING})
FINAL_STATUSES = frozenset({SessionStatus.COMPLETED, SessionStatus.FAILED, SessionStatus.CANCELLED})


class CheckpointReason(enum.StrEnum):
    AUTO = "auto"
    MANUAL = "manual"
    BEFORE_ROLLBACK = "before-rollback"
    MIGRATION = "migration"


@dataclass
class PlanItem:
    title: str
    status: str = "pending"  # pending | in_progress | done

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "status": self.status}


@dataclass
class Counters:
    steps: int = 0
    model_calls: int = 0
    tool_calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0
    retries: int = 0


@dataclass
class Budgets:
    max_steps: int = 200
    max_tokens: int | None = None
    max_cost: float | None = None


@dataclass
class PendingApproval:
    """A tool call the model asked for that waits for a person's decision."""

    call_id: str
    tool: str
    arguments: dict[str, Any]
    model_seq: int
    requested_at: str | None = None


@dataclass
class SessionState:
    """Everything a resume needs besides the message history (which is the steps)."""

    agent_name: str
    agent_version: str
    plan: list[PlanItem] = field(default_factory=list)
    memory_refs: list[str] = field(default_factory=list)
    counters: Counters = field(default_factory=Counters)
    budgets: Budgets = field(default_factory=Budgets)
    turn: int = 0
    pending_approval: PendingApproval | None = None
    uncertain_calls: list[str] = field(default_factory=list)
    batch_cursor: dict[str, Any] | None = None
    final_answer: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Serialise to the current schema version (writers only ever emit that)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "agent": {"name": self.agent_name, "version": self.agent_version},
            "turn": self.turn,
            "plan": [item.to_dict() for item in self.plan],
            "memory_refs": list(self.memory_refs),
            "counters": dataclasses.asdict(self.counters),
            "budgets": dataclasses.asdict(self.budgets),
            "pending_approval": (
                dataclasses.asdict(self.pending_approval) if self.pending_approval else None
            ),
            "uncertain_calls": list(self.uncertain_calls),
            "batch_cursor": self.batch_cursor,
            "final_answer": self.final_answer,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SessionState:
        """Build from a blob already upgraded to SCHEMA_VERSION; refuse anything else."""
        if not isinstance(data, dict):
            raise StateError(f"state must be an object, got {type(data).__name__}")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise StateError(
                f"state has schema_version {version!r}; expected {SCHEMA_VERSION} "
                "(load it through agent_runtime.upgraders)"
            )
        try:
            agent = data["agent"]
            pending = data.get("pending_approval")
            return cls(
                agent_name=str(agent["name"]),
                agent_version=str(agent["version"]),
                turn=int(data.get("turn", 0)),
                plan=[
                    PlanItem(title=str(p["title"]), status=str(p["status"])) for p in data["plan"]
                ],
                memory_refs=[str(ref) for ref in data["memory_refs"]],
                counters=Counters(**data["counters"]),
                budgets=Budgets(**data["budgets"]),
                pending_approval=PendingApproval(**pending) if pending else None,
                uncertain_calls=[str(c) for c in data.get("uncertain_calls", [])],
                batch_cursor=data.get("batch_cursor"),
                final_answer=data.get("final_answer"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(
                f"state does not match schema version {SCHEMA_VERSION}: {exc}"
            ) from exc


@dataclass(frozen=True)
class NewStep:
    """A step the loop wants to append; the store assigns its seq."""

    kind: StepKind
    payload: dict[str, Any]
    started_at: datetime | None = None
    finished_at: datetime | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    idempotency_key: str | None = None


@dataclass(frozen=True)
class StepRecord:
    """A stored step, as the engine sees it."""

    seq: int
    kind: StepKind
    payload: dict[str, Any]
    schema_version: int = SCHEMA_VERSION
    started_at: datetime | None = None
    finished_at: datetime | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    idempotency_key: str | None = None
    superseded: bool = False


@dataclass(frozen=True)
class CheckpointRecord:
    seq: int
    state: SessionState
    reason: CheckpointReason
    schema_version: int = SCHEMA_VERSION


@dataclass(frozen=True)
class NewCheckpoint:
    state: SessionState
    reason: CheckpointReason = CheckpointReason.AUTO
