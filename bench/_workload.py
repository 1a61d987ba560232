"""The workload every contender runs: a zero-latency scripted model and a trivial tool.

One turn is: the model answers with one tool call, the tool returns. The model's text and
the tool's output each carry `payload_bytes` of text: words drawn with a long-tailed
(Zipf-like) frequency from a vocabulary of some thousands, roughly as in prose, so neither
TOAST compression nor the full-text index sees something unrealistically easy or hard.
Every contender writes the same payloads; only what each system stores around them differs.
"""

from __future__ import annotations

import functools
import random
import statistics
import time
from dataclasses import dataclass, field

# The seeded deployments of the dashboard and admin benches: a hundred sessions' statuses
# as a busy deployment has them, and the agents they belong to.
STATUSES = (
    ["completed"] * 80
    + ["failed"] * 8
    + ["cancelled"] * 4
    + ["paused"] * 3
    + ["waiting_input"] * 3
    + ["running", "queued"]
)
AGENTS = ["demo", "slow", "flaky", "approval", "echo"]

WORDS = (
    "agent state durable step checkpoint lease token worker resume model tool result plan "
    "memory budget session trace commit replay fence queue batch cursor version upgrade "
    "operator approve reject rollback fork audit dashboard signal reconcile heartbeat"
).split()


@functools.cache
def filler(n: int, seed: int) -> str:
    """About n characters of words, different for every seed. Cached: the scripted model
    is zero-latency, and every contender gets its text from the same cache (warmed before
    any timing by `warm`)."""
    if n <= 0:
        return ""
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < n:
        rank = min(int(rng.paretovariate(1.1)), 200)
        word = rng.choice(WORDS) + ("" if rank == 1 else str(rank))
        out.append(word)
        size += len(word) + 1
    return " ".join(out)[:n]


def model_text(turn: int, payload_bytes: int) -> str:
    return f"Step {turn}. " + filler(payload_bytes, seed=2 * turn)


def tool_output(n: int, payload_bytes: int) -> dict:
    return {"n": n, "text": filler(payload_bytes, seed=2 * n + 1)}


def warm(turns: int, payload_bytes: int) -> None:
    for turn in range(turns + 1):
        model_text(turn, payload_bytes)
        tool_output(turn, payload_bytes)


@dataclass
class Timings:
    """Per-step latencies (seconds): the time from one durable step to the next."""

    steps: list[float] = field(default_factory=list)
    _last: float | None = None

    def start(self) -> None:
        self._last = time.perf_counter()

    def mark(self) -> None:
        now = time.perf_counter()
        if self._last is not None:
            self.steps.append(now - self._last)
        self._last = now

    def p(self, q: float) -> float:
        data = sorted(self.steps)
        if not data:
            return float("nan")
        return data[min(len(data) - 1, int(q * len(data)))] * 1000

    @property
    def p50(self) -> float:
        return statistics.median(self.steps) * 1000 if self.steps else float("nan")

    @property
    def p99(self) -> float:
        return self.p(0.99)


def table_bytes(conn, tables: list[str]) -> int:
    """Heap + TOAST + indexes of the tables, as PostgreSQL has them on disk."""
    total = 0
    for table in tables:
        row = conn.execute("SELECT pg_total_relation_size(%s::regclass)", (table,)).fetchone()
        total += row[0]
    return total
