"""The fence around tool calls: no call starts after the run's lease ran out by its own
clock, a tool's fenced write is refused once another holder has the session, a
non-idempotent call started by a fenced-off run is reported; and infrastructure errors
inside a tool are retried as transient, recorded apart from the tool's own errors."""

from __future__ import annotations

import time

from agent_runtime.agents import Agent, AgentRegistry
from agent_runtime.loop import Outcome
from agent_runtime.providers import ModelTurn, ToolCall
from agent_runtime.state import StepKind
from agent_runtime.store import InMemoryEffects, InMemoryStore, LeaseLost
from agent_runtime.tools import (
    NO_TRANSIENT_RETRY,
    ToolContext,
    ToolError,
    TransientRetry,
    is_infrastructure_error,
    tool,
)

from .helpers import new_session, run


class CallOnce:
    """A model that calls one tool, then answers with what the tool returned."""

    def __init__(self, name: str) -> None:
        self.name = name

    def complete(self, messages, tools, settings):
        if messages[-1].role == "tool":
            return ModelTurn(text=f"done: {messages[-1].content}")
        return ModelTurn(text=None, tool_calls=[ToolCall("c1", self.name, {"to": "ops"})])


def one_tool_agent(t) -> AgentRegistry:
    return AgentRegistry([Agent(name="one", model="scripted:echo", tools=[t])])


def provider(name: str):
    return lambda spec, options: (CallOnce(name), "m")


class FreezeAfterToolCall:
    """Wraps a store: right after the tool_call step commits, the worker 'freezes' past
    its lease (sleeps), and another worker may take the session over meanwhile."""

    def __init__(self, inner: InMemoryStore, pause: float, take_over: bool) -> None:
        self.inner = inner
        self.pause = pause
        self.take_over = take_over

    def append(self, lease, steps, **kwargs):
        result = self.inner.append(lease, steps, **kwargs)
        if any(s.kind == StepKind.TOOL_CALL for s in steps):
            time.sleep(self.pause)
            if self.take_over:
                assert self.inner.claim(lease.session_id, "intruder", ttl=30) is not None
        return result

    def __getattr__(self, name):
        return getattr(self.inner, name)


def frozen_run(take_over: bool):
    started = []

    @tool(idempotent=False)
    def notify(ctx: ToolContext, to: str) -> dict:
        """Send a notification."""
        started.append(ctx.attempt)
        return {"to": to}

    inner = InMemoryStore()
    session_id = new_session(inner, "one", "notify ops")
    store = FreezeAfterToolCall(inner, pause=0.5, take_over=take_over)
    result = run(
        store,
        session_id,
        agents=one_tool_agent(notify),
        make_provider=provider("notify"),
        # No heartbeat in between: the lease runs out while the worker is frozen.
        config={"lease_ttl": 0.3, "heartbeat_interval": 30},
    )
    return inner, session_id, result, started


def test_a_frozen_worker_does_not_start_the_call_once_another_took_the_session():
    store, session_id, result, started = frozen_run(take_over=True)
    assert result.outcome == Outcome.LEASE_LOST
    assert started == [], "the call started after the lease was gone"
    kinds = [str(s.kind) for s in store.session(session_id).steps]
    assert kinds[-1] == "tool_call"
    # Not started: nothing to report.
    assert store.session(session_id).late_calls == []


def test_a_lease_that_ran_out_by_the_clock_but_was_not_taken_is_renewed_and_the_call_runs():
    store, session_id, result, started = frozen_run(take_over=False)
    assert result.outcome == Outcome.COMPLETED
    assert started == [1]
    assert store.session(session_id).late_calls == []


def test_a_fenced_write_of_a_run_that_lost_the_session_is_refused_and_reported():
    store = InMemoryStore()
    effects = InMemoryEffects()
    session_id = new_session(store, "one", "notify ops")

    @tool(idempotent=False)
    def notify(ctx: ToolContext, to: str) -> dict:
        """Send a notification, tied to the run's fence."""
        # The run freezes mid-call; an operator's decision gives the session to another run.
        store.expire_lease(ctx.session_id)
        assert store.claim(ctx.session_id, "next-run", ttl=30) is not None
        with ctx.fenced():
            ctx.effects.record(ctx.idempotency_key, session_id=ctx.session_id, tool="n", payload={})
        return {"to": to}

    result = run(
        store,
        session_id,
        effects=effects,
        agents=one_tool_agent(notify),
        make_provider=provider("notify"),
    )
    assert result.outcome == Outcome.LEASE_LOST
    assert effects.rows == {}, "the late write landed"
    [report] = store.session(session_id).late_calls
    assert report["tool"] == "notify" and report["effect"] == "refused"
    assert report["owner"] == "w1" and report["call_id"] == "c1"
    assert [str(s.kind) for s in store.session(session_id).steps][-1] == "tool_call"


def test_a_non_idempotent_call_that_ran_past_the_fence_unfenced_is_reported_not_hidden():
    store = InMemoryStore()
    effects = InMemoryEffects()
    session_id = new_session(store, "one", "notify ops")

    @tool(idempotent=False)
    def notify(ctx: ToolContext, to: str) -> dict:
        """Send a notification through a service that knows nothing of fences."""
        store.expire_lease(ctx.session_id)
        assert store.claim(ctx.session_id, "next-run", ttl=30) is not None
        ctx.effects.record(ctx.idempotency_key, session_id=ctx.session_id, tool="n", payload={})
        return {"to": to}

    result = run(
        store,
        session_id,
        effects=effects,
        agents=one_tool_agent(notify),
        make_provider=provider("notify"),
    )
    assert result.outcome == Outcome.LEASE_LOST
    assert len(effects.rows) == 1  # it happened: nothing could stop it
    [report] = store.session(session_id).late_calls
    assert report["effect"] == "may have happened"
    assert not any(s.kind == StepKind.TOOL_RESULT for s in store.session(session_id).steps)


def test_fenced_outside_a_run_fences_nothing():
    ctx = ToolContext(
        session_id="s",
        call_id="c",
        seq=1,
        idempotency_key="k",
        attempt=1,
        effects=InMemoryEffects(),
    )
    with ctx.fenced():
        pass


# --- Infrastructure errors inside a tool --------------------------------------------------

FAST = TransientRetry(retry_for=2.0, backoff=0.01, backoff_max=0.05)


def run_tool(t, transient=FAST):
    ctx = lambda attempt: ToolContext(  # noqa: E731
        session_id="s",
        call_id="c",
        seq=1,
        idempotency_key="k",
        attempt=attempt,
        effects=InMemoryEffects(),
    )
    return t.run(ctx, {}, transient)


def test_an_infrastructure_error_is_retried_with_backoff_and_kept_apart_in_the_attempts():
    @tool
    def fetch(ctx: ToolContext) -> str:
        """Fails twice on the connection, then works."""
        if ctx.attempt <= 2:
            raise ConnectionRefusedError(111, "Connection refused")
        return "ok"

    outcome = run_tool(fetch)
    assert outcome.ok and outcome.output == "ok" and outcome.attempts == 3
    assert all(e.startswith("infrastructure error: ") for e in outcome.attempt_errors)
    assert "Connection refused" in outcome.attempt_errors[0]


def test_an_infrastructure_error_that_persists_is_recorded_as_such_after_the_retry_window():
    @tool
    def fetch(ctx: ToolContext) -> str:
        """The database is out of connection slots, for good."""
        raise _driver_error("OperationalError", "FATAL: sorry, too many clients already")

    started = time.monotonic()
    outcome = run_tool(fetch, TransientRetry(retry_for=0.3, backoff=0.02, backoff_max=0.05))
    assert 0.2 < time.monotonic() - started < 2.0
    assert not outcome.ok and outcome.failure == "infrastructure"
    assert (
        outcome.error.startswith("infrastructure error: ") and "too many clients" in outcome.error
    )
    assert outcome.attempts > 3
    payload = outcome.payload("c", "fetch")
    assert payload["failure"] == "infrastructure" and payload["status"] == "error"


def test_a_tool_error_is_not_retried_and_is_the_tools_own():
    @tool
    def fetch(ctx: ToolContext) -> str:
        """Fails on its own terms."""
        raise ToolError("no such order")

    outcome = run_tool(fetch)
    assert not outcome.ok and outcome.attempts == 1 and outcome.failure == "tool"
    assert outcome.payload("c", "fetch")["failure"] == "tool"


def test_a_non_idempotent_tool_is_not_retried_on_an_infrastructure_error():
    calls = []

    @tool(idempotent=False)
    def send(ctx: ToolContext) -> str:
        """The connection broke: maybe after the effect."""
        calls.append(ctx.attempt)
        raise ConnectionResetError(104, "Connection reset by peer")

    outcome = run_tool(send)
    assert calls == [1]
    assert outcome.failure == "infrastructure" and "not idempotent" in outcome.error


def test_the_tools_own_timeout_error_is_transient_and_an_overrun_is_a_timeout():
    @tool
    def fetch(ctx: ToolContext) -> str:
        """A socket timed out once."""
        if ctx.attempt == 1:
            raise TimeoutError("timed out")
        return "ok"

    assert run_tool(fetch).attempts == 2

    @tool(timeout=0.05)
    def hang(ctx: ToolContext) -> str:
        """Overruns its timeout."""
        time.sleep(0.5)
        return "late"

    outcome = run_tool(hang)
    assert outcome.failure == "timeout" and outcome.attempts == 1
    assert "timed out after 0.05s" in outcome.error


def test_without_a_retry_policy_an_infrastructure_error_fails_at_once():
    @tool
    def fetch(ctx: ToolContext) -> str:
        """Down."""
        raise ConnectionRefusedError(111, "Connection refused")

    outcome = run_tool(fetch, NO_TRANSIENT_RETRY)
    assert outcome.attempts == 1 and outcome.failure == "infrastructure"


def _driver_error(name: str, message: str) -> Exception:
    """An error of a database driver's class (named and placed as psycopg's are)."""
    cls = type(name, (Exception,), {"__module__": "psycopg.errors"})
    return cls(message)


def test_infrastructure_errors_are_told_from_errors_about_the_query():
    assert is_infrastructure_error(
        _driver_error("OperationalError", "server closed the connection")
    )
    assert is_infrastructure_error(_driver_error("InterfaceError", "connection already closed"))
    assert not is_infrastructure_error(_driver_error("IntegrityError", "duplicate key"))
    assert not is_infrastructure_error(_driver_error("ProgrammingError", "syntax error"))
    assert not is_infrastructure_error(ValueError("bad input"))
    # A wrapper (as Django wraps the driver's errors) is judged by its cause.
    try:
        try:
            raise _driver_error("OperationalError", "too many clients")
        except Exception as exc:
            raise RuntimeError("wrapped") from exc
    except RuntimeError as wrapped:
        assert is_infrastructure_error(wrapped)
    assert is_infrastructure_error(
        type("ConnectionError", (Exception,), {"__module__": "redis.exceptions"})()
    )
    assert not is_infrastructure_error(LeaseLost("fenced"))


def test_an_infrastructure_failure_reaches_the_trace_marked_and_the_session_goes_on():
    @tool(idempotent=True)
    def notify(ctx: ToolContext, to: str) -> dict:
        """The database under it is gone."""
        raise ConnectionRefusedError(111, "Connection refused")

    store = InMemoryStore()
    session_id = new_session(store, "one", "notify ops")
    result = run(
        store,
        session_id,
        agents=one_tool_agent(notify),
        make_provider=provider("notify"),
        config={"transient": TransientRetry(retry_for=0.1, backoff=0.02)},
    )
    assert result.outcome == Outcome.COMPLETED
    [step] = [s for s in store.session(session_id).steps if s.kind == StepKind.TOOL_RESULT]
    assert step.payload["failure"] == "infrastructure"
    assert step.payload["attempts"] >= 2
