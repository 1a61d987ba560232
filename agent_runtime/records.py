"""Where the `migrate` demo agent's records live: a protocol the engine talks through (as
it does to the EffectLedger), and an in-memory implementation for engine tests.

A batch is migrated under its tool call's idempotency key, in one unit: either every
record of the batch is migrated and the batch is recorded under the key, or nothing is.
A batch run again with a key already recorded returns the recorded outcome and migrates
nothing, so a crash between the batch's commit and its result step costs no record twice.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class BatchOutcome:
    start: int  # records before the batch (the cursor it started at)
    end: int  # records after it (the next cursor)
    migrated: int  # records this call migrated (0 when the key was already recorded)
    replayed: bool = False  # the key was already recorded: nothing was migrated again

    def to_dict(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "end": self.end,
            "migrated": self.migrated,
            "replayed": self.replayed,
        }


class RecordSource(Protocol):
    def ensure(self, dataset: str, total: int) -> None:
        """Make sure the dataset holds records 1..total (creates the missing ones)."""

    def migrate_batch(self, key: str, *, dataset: str, start: int, size: int) -> BatchOutcome:
        """Migrate records start+1 .. start+size of the dataset once per key."""


def migrate_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """The demo migration itself: a v1 record (name, amount in cents) to its v2 shape."""
    name = str(payload.get("name", ""))
    return {
        "schema": 2,
        "display_name": name.title(),
        "amount": {"cents": int(payload.get("cents", 0)), "currency": "EUR"},
    }


def demo_record(number: int) -> dict[str, Any]:
    """The deterministic v1 payload of record `number`."""
    return {"name": f"customer {number}", "cents": (number * 37) % 10_000}


class InMemoryRecords:
    def __init__(self) -> None:
        self.records: dict[str, dict[int, dict[str, Any]]] = {}
        self.migrated_by: dict[tuple[str, int], list[str]] = {}
        self.batches: dict[str, BatchOutcome] = {}
        self._lock = threading.Lock()

    def ensure(self, dataset: str, total: int) -> None:
        with self._lock:
            rows = self.records.setdefault(dataset, {})
            for number in range(1, total + 1):
                rows.setdefault(number, {"payload": demo_record(number), "output": None})

    def migrate_batch(self, key: str, *, dataset: str, start: int, size: int) -> BatchOutcome:
        with self._lock:
            if key in self.batches:
                return BatchOutcome(**{**self.batches[key].to_dict(), "replayed": True})
            rows = self.records.get(dataset, {})
            numbers = [n for n in range(start + 1, start + size + 1) if n in rows]
            for number in numbers:
                rows[number]["output"] = migrate_payload(rows[number]["payload"])
                self.migrated_by.setdefault((dataset, number), []).append(key)
            outcome = BatchOutcome(start=start, end=start + len(numbers), migrated=len(numbers))
            self.batches[key] = outcome
            return outcome
