"""Versioned loaders for stored blobs.

Every read of a checkpoint state or a step payload goes through `load_state` /
`load_step_payload`. Each released version gets a pure upgrader `vN -> vN+1` in
`STATE_UPGRADERS` / `STEP_UPGRADERS`; released upgraders are never edited. A blob from a
version newer than this code knows is refused with `IncompatibleSchemaError`, never half-read.

Version 1 is the first released shape (see `state.py`):
  state:   {"schema_version": 1, "agent": {"name", "version"}, "turn", "plan": [{"title",
            "status"}], "memory_refs": [str], "counters": {...}, "budgets": {...},
            "pending_approval": null | {...}, "uncertain_calls": [str], "batch_cursor",
            "final_answer"}
  steps:   user {"text"}; model {"text", "tool_calls": [{"id", "name", "arguments"}],
           "usage", "model"}; tool_call {"call_id", "name", "arguments", "idempotency_key"};
           tool_result {"call_id", "name", "ok", "output", "error", "attempts"};
           error {"where", "error", "attempts", "permanent"}; operator {"action", "actor", ...};
           system {"event", ...}
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .state import SCHEMA_VERSION, SessionState

Upgrader = Callable[[dict[str, Any]], dict[str, Any]]

# from_version -> function returning the blob at from_version + 1
STATE_UPGRADERS: dict[int, Upgrader] = {}
STEP_UPGRADERS: dict[int, Upgrader] = {}


class IncompatibleSchemaError(Exception):
    """A stored blob cannot be loaded by this code (too new, or no upgrade path)."""

    def __init__(self, message: str, *, found: Any, supported: int = SCHEMA_VERSION):
        super().__init__(message)
        self.found = found
        self.supported = supported


@dataclass(frozen=True)
class Loaded:
    value: Any
    stored_version: int
    applied: tuple[str, ...]


def _upgrade(blob: dict[str, Any], version: Any, chain: dict[int, Upgrader], what: str) -> Loaded:
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise IncompatibleSchemaError(
            f"{what} has no valid schema version: {version!r}", found=version
        )
    if version > SCHEMA_VERSION:
        raise IncompatibleSchemaError(
            f"{what} was written by schema version {version}, newer than this code "
            f"understands (up to {SCHEMA_VERSION}); deploy the newer code or roll the data back",
            found=version,
        )
    applied: list[str] = []
    current = version
    while current < SCHEMA_VERSION:
        upgrader = chain.get(current)
        if upgrader is None:
            raise IncompatibleSchemaError(
                f"{what}: no upgrader from schema version {current}", found=version
            )
        blob = upgrader(blob)
        applied.append(f"v{current}->v{current + 1}")
        current += 1
    return Loaded(value=blob, stored_version=version, applied=tuple(applied))


def load_state(blob: dict[str, Any]) -> Loaded:
    """Upgrade a stored state blob and build the SessionState (value)."""
    if not isinstance(blob, dict):
        raise IncompatibleSchemaError("checkpoint state is not a JSON object", found=None)
    loaded = _upgrade(dict(blob), blob.get("schema_version"), STATE_UPGRADERS, "checkpoint state")
    return Loaded(
        value=SessionState.from_dict(loaded.value),
        stored_version=loaded.stored_version,
        applied=loaded.applied,
    )


def load_step_payload(payload: dict[str, Any], version: int) -> Loaded:
    """Upgrade a stored step payload; the step's schema version lives beside the payload."""
    if not isinstance(payload, dict):
        raise IncompatibleSchemaError("step payload is not a JSON object", found=version)
    return _upgrade(dict(payload), version, STEP_UPGRADERS, "step payload")
