"""What the engine tells the deployment's monitoring: runs, model calls, tool calls, steps
written, checkpoints, recoveries and fenced writes, as they happen.

The engine knows no monitoring system. It calls a `Telemetry` (RunConfig.telemetry) at each
of these points; the base class does nothing, and sessions_app builds the ones a deployment
turned on (Prometheus counters and histograms of the worker process, OpenTelemetry spans
following the GenAI semantic conventions) and combines them with `combine`.

A hook must never fail a run: each call is guarded, and an exception a hook raises is
logged once and ignored.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

log = logging.getLogger("respawn.telemetry")

_R = TypeVar("_R")


@dataclass
class RunRecord:
    """One run of a session (a job that holds its lease), filled in as it goes."""

    session_id: str
    agent: str
    agent_version: str
    worker: str
    # A takeover of an expired lease: the run recovers from a crash of the one before.
    recovering: bool = False
    # Seconds from the last durable step to this run's start, when recovering.
    recovery_seconds: float | None = None
    outcome: str | None = None
    error: str | None = None
    # Each Telemetry may keep what it needs between the calls of one run here.
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ModelCallRecord:
    run: RunRecord
    provider: str
    model: str
    attempts: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost: float | None = None
    finish: str | None = None  # "tool_calls" | "stop"
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ToolCallRecord:
    run: RunRecord
    tool: str
    call_id: str
    ok: bool | None = None
    error: str | None = None
    attempts: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class Telemetry:
    """The hooks, each a no-op. Subclasses override what they record."""

    @contextlib.contextmanager
    def run(self, record: RunRecord) -> Iterator[RunRecord]:
        yield record

    @contextlib.contextmanager
    def model_call(self, record: ModelCallRecord) -> Iterator[ModelCallRecord]:
        yield record

    @contextlib.contextmanager
    def tool_call(self, record: ToolCallRecord) -> Iterator[ToolCallRecord]:
        yield record

    def steps_written(
        self, run: RunRecord, kinds: Sequence[str], seconds: float, checkpoint_seq: int | None
    ) -> None:
        """An append committed: the kinds of its steps, how long the write took, and the
        seq of the checkpoint written with them (None: none)."""

    def fenced(self, run: RunRecord, where: str) -> None:
        """A write (or a tool call about to start) was refused: the lease was lost."""

    def budget_reached(self, run: RunRecord, budget: str) -> None:
        """A budget paused the session."""


NO_TELEMETRY = Telemetry()


class _Combined(Telemetry):
    def __init__(self, parts: Sequence[Telemetry]) -> None:
        self.parts = list(parts)

    def _nested(self, method: str, record: _R) -> Iterator[_R]:
        with contextlib.ExitStack() as stack:
            for part in self.parts:
                try:
                    stack.enter_context(getattr(part, method)(record))
                except Exception:
                    _hook_failed(part, method)
            yield record

    @contextlib.contextmanager
    def run(self, record: RunRecord) -> Iterator[RunRecord]:
        yield from self._nested("run", record)

    @contextlib.contextmanager
    def model_call(self, record: ModelCallRecord) -> Iterator[ModelCallRecord]:
        yield from self._nested("model_call", record)

    @contextlib.contextmanager
    def tool_call(self, record: ToolCallRecord) -> Iterator[ToolCallRecord]:
        yield from self._nested("tool_call", record)

    def steps_written(
        self, run: RunRecord, kinds: Sequence[str], seconds: float, checkpoint_seq: int | None
    ) -> None:
        for part in self.parts:
            guarded(part.steps_written, run, kinds, seconds, checkpoint_seq)

    def fenced(self, run: RunRecord, where: str) -> None:
        for part in self.parts:
            guarded(part.fenced, run, where)

    def budget_reached(self, run: RunRecord, budget: str) -> None:
        for part in self.parts:
            guarded(part.budget_reached, run, budget)


def combine(parts: Sequence[Telemetry]) -> Telemetry:
    """One Telemetry that calls each of `parts` (none: NO_TELEMETRY)."""
    parts = [p for p in parts if p is not NO_TELEMETRY]
    if not parts:
        return NO_TELEMETRY
    return parts[0] if len(parts) == 1 else _Combined(parts)


_reported: set[tuple[str, str]] = set()


def _hook_failed(part: Telemetry, method: str) -> None:
    key = (type(part).__name__, method)
    if key not in _reported:  # once per hook and process: monitoring must not flood logs
        _reported.add(key)
        log.warning("telemetry hook %s.%s failed; ignored", *key, exc_info=True)


def guarded(hook: Any, *args: Any) -> None:
    try:
        hook(*args)
    except Exception:
        _hook_failed(hook.__self__ if hasattr(hook, "__self__") else hook, hook.__name__)


@contextlib.contextmanager
def observe(telemetry: Telemetry, method: str, record: Any) -> Iterator[Any]:
    """Enter a hook's context manager without letting its failure (on entry or exit)
    reach the run; the body's own exceptions pass through unchanged."""
    try:
        manager = getattr(telemetry, method)(record)
        manager.__enter__()
    except Exception:
        _hook_failed(telemetry, method)
        yield record
        return
    try:
        yield record
    except BaseException as exc:
        try:
            manager.__exit__(type(exc), exc, exc.__traceback__)
        except Exception:
            _hook_failed(telemetry, method)
        raise
    else:
        try:
            manager.__exit__(None, None, None)
        except Exception:
            _hook_failed(telemetry, method)
