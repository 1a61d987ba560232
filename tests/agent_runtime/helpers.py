"""Engine test helpers: an in-memory session, a runner, and a store that crashes on cue."""

from __future__ import annotations

import itertools
from typing import Any

from agent_runtime.loop import RunConfig, RunResult, run_session
from agent_runtime.store import InMemoryEffects, InMemoryStore
from demo_agents import demo_agents

_ids = itertools.count(1)


class Crash(BaseException):
    """A process death: not an Exception, so no handler in the engine catches it."""


class CrashingStore:
    """Wraps a store; the n-th append (`crash_at`), or the append that writes step `at_seq`,
    dies before (or after) it commits. An append may write several steps (the model's
    answer with the call it asks for): `at_seq` names a crash point by what was written."""

    def __init__(
        self,
        inner: Any,
        crash_at: int | None = None,
        after_commit: bool = False,
        *,
        at_seq: int | None = None,
    ) -> None:
        assert (crash_at is None) != (at_seq is None), "crash_at or at_seq"
        self.inner = inner
        self.crash_at = crash_at
        self.at_seq = at_seq
        self.after_commit = after_commit
        self.appends = 0
        self.next_seq: int | None = None

    def append(self, lease, steps, **kwargs):
        self.appends += 1
        if self.next_seq is None:
            self.next_seq = self.inner.load_head(lease.session_id).last_seq + 1
        if self.at_seq is None:
            hit = self.appends == self.crash_at
        else:
            hit = self.next_seq <= self.at_seq < self.next_seq + len(steps)
        if hit and not self.after_commit:
            raise Crash(f"killed before append {self.appends}")
        result = self.inner.append(lease, steps, **kwargs)
        if result.seqs:
            self.next_seq = result.seqs[-1] + 1
        if hit:
            raise Crash(f"killed after append {self.appends}")
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class CountingStore:
    """Wraps a store and counts its appends (the crash points of a run)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.appends = 0
        self.kinds: list[list[str]] = []  # the kinds of the steps of each append

    def append(self, lease, steps, **kwargs):
        self.appends += 1
        self.kinds.append([str(s.kind) for s in steps])
        return self.inner.append(lease, steps, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def new_session(store: InMemoryStore, agent: str, text: str) -> str:
    session_id = f"s{next(_ids)}"
    store.create_session(session_id, agent, text)
    return session_id


def run(
    store, session_id: str, effects=None, agents=None, worker: str = "w1", **kwargs
) -> RunResult:
    return run_session(
        session_id,
        store=store,
        agents=agents or demo_agents(slow_delay=0),
        effects=effects if effects is not None else InMemoryEffects(),
        config=RunConfig(
            **{
                "worker_id": worker,
                "lease_ttl": 30,
                "model_backoff": 0.0,
                **kwargs.pop("config", {}),
            }
        ),
        **kwargs,
    )


def conversation(store: InMemoryStore, session_id: str) -> list[tuple[str, dict]]:
    """Kinds and payloads of the live trace, without per-run system steps and ids."""
    out = []
    for step in store.session(session_id).steps:
        if step.superseded or step.kind == "system":
            continue
        payload = _strip_ids(step.payload, session_id)
        out.append((str(step.kind), payload))
    return out


def _strip_ids(value: Any, session_id: str) -> Any:
    if isinstance(value, dict):
        return {k: _strip_ids(v, session_id) for k, v in value.items() if k != "requested_at"}
    if isinstance(value, list):
        return [_strip_ids(v, session_id) for v in value]
    if isinstance(value, str):
        return value.replace(session_id, "<session>")
    return value
