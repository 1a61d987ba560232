"""Tools: typed Python functions with a JSON schema, argument validation, idempotency keys.

    from agent_runtime import ToolContext, ToolError, tool

    @tool(idempotent=False, needs_approval=True, timeout=20)
    def issue_refund(ctx: ToolContext, order_id: str, amount_cents: int) -> dict:
        "Refund an order (a person approves each call)."
        ...

The schema comes from the signature (pydantic), built when the function is decorated, so a
parameter that cannot become a schema fails at import, naming the tool. The first
parameter, when it is annotated `ToolContext` or named `ctx`/`context`, receives the
context; every other parameter is an argument the model fills in. An `async def` tool runs
on its own event loop. A tool that raises, gets invalid arguments, times out or does not
exist produces a `ToolOutcome` with ok=False: a result the model sees, never a crash of the
loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import functools
import inspect
import json
import os
import sys
import threading
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pydantic

from .records import RecordSource
from .state import ToolResultPayload
from .store import EffectLedger, LeaseLost

# A tool reporting progress writes it to the session row at most this often.
PROGRESS_INTERVAL = 0.5


class ToolError(Exception):
    """Raised by a tool to report a failure; retryable ones are tried again."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class AgentStateUnavailable(RuntimeError):
    """A tool used `ctx.state` in an agent that keeps no state of its own."""


# Reports progress (done, total, message) for the session; returns False once the run's
# lease is lost.
ProgressSink = Callable[[int, int | None, str], bool]
# Holds the run's fence around a tool's own writes (SessionStore.fenced for the run's lease).
FenceGuard = Callable[[], contextlib.AbstractContextManager[None]]


# Modules whose errors are the infrastructure's, not the tool's: a database driver, Redis,
# an HTTP client's connection layer. Matched on the exception's class and its causes, so
# the engine needs none of them installed; the host adds its own (RunConfig.transient).
_INFRASTRUCTURE_MODULES = ("psycopg", "psycopg2", "psycopg_pool", "redis", "sqlite3")


def is_infrastructure_error(exc: BaseException) -> bool:
    """True for an error of the infrastructure a tool runs on rather than of the tool: a
    connection refused, reset or timed out, a database or Redis that is down or out of
    connections. Such errors are transient: the call is retried with backoff. Errors the
    database raises about the query itself (an integrity or programming error) are not."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ConnectionError | TimeoutError):
            return True
        for cls in type(current).__mro__:
            module = cls.__module__.split(".")[0]
            if module in _INFRASTRUCTURE_MODULES and cls.__name__ in (
                "OperationalError",
                "InterfaceError",
                "PoolTimeout",
                "TooManyConnections",
                "ConnectionError",
                "TimeoutError",
                "BusyLoadingError",
            ):
                return True
        current = current.__cause__ or current.__context__
    return False


@dataclass(frozen=True)
class TransientRetry:
    """How a call that failed on the infrastructure is tried again: with exponential
    backoff (`backoff`, doubling, at most `backoff_max` apart) for up to `retry_for`
    seconds after its first failure. `is_transient` says which errors are the
    infrastructure's."""

    # At most 2 s apart: a database back from a restart is used within 2 s, for the cost
    # of a connection attempt every 2 s per waiting call while it is down.
    retry_for: float = 60.0
    backoff: float = 0.25
    backoff_max: float = 2.0
    is_transient: Callable[[BaseException], bool] = is_infrastructure_error


NO_TRANSIENT_RETRY = TransientRetry(retry_for=0.0)


@dataclass
class ToolContext:
    """What a running tool may know and use.

    - `session_id`, `call_id`, `seq`, `attempt`, `agent_name`, `agent_version`;
    - `idempotency_key`: stable across re-runs of this call after a crash (session:seq);
      pass it to the service you call, so the call happens once;
    - `state`: the agent's own state (a dict), when the agent declares `AgentState`;
      change it in place, and the changed top-level keys are recorded with this call's
      result (discarded when the call fails);
    - `report_progress(done, total, message)`: shown on the session page and in the API
      while the tool runs;
    - `set_plan`, `remember`, `set_batch_cursor`: the engine's own state;
    - `fenced()`: a block whose writes land only while this run still holds the session
      (see its docstring), and `fence_token`, to hand to a service that keeps fencing
      tokens of its own.
    """

    session_id: str
    call_id: str
    seq: int
    idempotency_key: str
    attempt: int
    effects: EffectLedger
    options: dict[str, Any] = field(default_factory=dict)
    memory_added: list[str] = field(default_factory=list)
    plan_update: list[tuple[str, str]] | None = None
    # The records a batch tool works through (the migrate demo agent's), when the host has any.
    records: RecordSource | None = None
    batch_cursor: dict[str, Any] | None = None
    agent_name: str = ""
    agent_version: str = ""
    # The agent's own state as the call found it ({"version", "data"}; None: the agent
    # keeps none). `state` is the tool's working copy of its data.
    agent_state: dict[str, Any] | None = None
    progress: ProgressSink | None = None
    # The run's fencing token: it grows with every new holder of the session, so a service
    # that remembers the highest token it has seen can refuse a late caller's request.
    fence_token: int = 0
    fence: FenceGuard | None = field(default=None, repr=False)
    _state: dict[str, Any] | None = field(default=None, repr=False)
    _progress_at: float = field(default=0.0, repr=False)

    def __post_init__(self) -> None:
        if self.agent_state is not None:
            self._state = copy.deepcopy(self.agent_state["data"])

    @property
    def state(self) -> dict[str, Any]:
        """The agent's own state, to read and change in place."""
        if self._state is None:
            raise AgentStateUnavailable(
                f"agent {self.agent_name!r} keeps no state of its own; give it "
                "state=AgentState(...) to use ctx.state"
            )
        return self._state

    def state_patch(self) -> dict[str, Any] | None:
        """The change this call made to the agent state: {"version", "set", "unset"} by
        top-level key, or None when it changed nothing."""
        if self.agent_state is None or self._state is None:
            return None
        before = self.agent_state["data"]
        after = self._state
        try:
            json.dumps(after)
        except (TypeError, ValueError) as exc:
            raise ToolError(f"the agent state must stay JSON: {exc}") from None
        changed = {k: v for k, v in after.items() if k not in before or before[k] != v}
        removed = sorted(k for k in before if k not in after)
        if not changed and not removed:
            return None
        return {"version": self.agent_state["version"], "set": changed, "unset": removed}

    def report_progress(self, done: int, total: int | None = None, message: str = "") -> bool:
        """Tell operators how far the tool got (e.g. 340 of 1,000 rows). Written to the
        session at most every half second; returns False when the run has lost its lease
        (another worker or an operator took over): stop early then."""
        if self.progress is None:
            return True
        now = time.monotonic()
        if now - self._progress_at < PROGRESS_INTERVAL and (total is None or done < total):
            return True
        self._progress_at = now
        return self.progress(int(done), None if total is None else int(total), str(message))

    def fenced(self) -> contextlib.AbstractContextManager[None]:
        """Tie the tool's own writes to this run's hold on the session:

            with ctx.fenced():
                Invoice.objects.create(...)  # commits only if the run still holds it

        On entry it checks the run's fencing token against the session (on Respawn's
        database, locking the session row against a takeover until the block ends; the
        block is one transaction there, so Django writes on the same database inside it
        commit with that check or not at all). A run that lost the session, to another
        worker after it froze past its lease or to an operator's decision, gets
        `LeaseLost` instead: the write never happens, and the run stops. Outside a run
        (a tool called directly) it fences nothing."""
        if self.fence is None:
            return contextlib.nullcontext()
        return self.fence()

    def set_batch_cursor(self, cursor: dict[str, Any]) -> None:
        """Set the session's batch cursor (how far a batch job got), checkpointed with the
        result of this call."""
        self.batch_cursor = dict(cursor)

    def set_plan(self, items: list[tuple[str, str]]) -> None:
        """Replace the session's plan with (title, status) pairs."""
        self.plan_update = list(items)

    def remember(self, ref: str) -> None:
        """Add a memory reference (a document id, note key, ...) to the session state."""
        self.memory_added.append(ref)


# Why a tool call failed, as its result records it ("failure"):
#   tool            the tool raised, or its arguments were invalid, or it does not exist
#   timeout         an attempt overran the tool's timeout
#   infrastructure  the database, Redis or the network failed under it, on every retry
#   rejected        a person rejected the call (not a failure of anything)
#   gave_up         a fan-out branch whose worker kept dying
FAILURE_KINDS = ("tool", "timeout", "infrastructure", "rejected", "gave_up")


@dataclass(frozen=True)
class ToolOutcome:
    ok: bool
    output: Any = None
    error: str | None = None
    attempts: int = 1
    # The errors of the attempts before the last one (retried errors), oldest first: a
    # result "ok after 3 attempts" says what went wrong twice.
    attempt_errors: tuple[str, ...] = ()
    memory_added: tuple[str, ...] = ()
    plan_update: tuple[tuple[str, str], ...] | None = None
    batch_cursor: dict[str, Any] | None = None
    agent_state: dict[str, Any] | None = None  # ToolContext.state_patch()
    # Why a failed call failed (FAILURE_KINDS); None when it succeeded.
    failure: str | None = None

    def payload(self, call_id: str, name: str) -> ToolResultPayload:
        """The tool_result step payload (current schema version)."""
        payload = ToolResultPayload(
            call_id=call_id,
            name=name,
            status="ok" if self.ok else "error",
            output=self.output,
            error=self.error,
            attempts=self.attempts,
        )
        if self.attempt_errors:
            # Optional and for people (the trace lists each attempt); the model is not shown it.
            payload["attempt_errors"] = list(self.attempt_errors)
        if not self.ok and self.failure:
            payload["failure"] = self.failure
        return payload


@dataclass(frozen=True)
class ToolSpec:
    """What a model is told about a tool."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass
class Tool:
    name: str
    description: str
    function: Callable[..., Any]
    arguments_model: type[pydantic.BaseModel]
    takes_context: bool = True
    needs_approval: bool = False
    idempotent: bool = True
    timeout: float = 30.0
    retries: int = 0
    retry_backoff: float = 0.05

    @functools.cached_property
    def spec(self) -> ToolSpec:
        # Built once: pydantic's schema generation costs more than a durable step, and the
        # loop asks for the specs on every model call.
        schema = self.arguments_model.model_json_schema()
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        return ToolSpec(self.name, self.description, schema)

    def validate(self, arguments: Any) -> dict[str, Any]:
        if not isinstance(arguments, dict):
            raise ToolError(f"arguments must be a JSON object, got {type(arguments).__name__}")
        try:
            return self.arguments_model.model_validate(arguments).model_dump()
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(root)'}: {err['msg']}"
                for err in exc.errors()
            )
            raise ToolError(f"invalid arguments for {self.name}: {problems}") from None

    def _bound(self, ctx: ToolContext) -> Callable[..., Any]:
        """The function to call with the arguments alone."""
        function = self.function
        if inspect.iscoroutinefunction(function):
            coroutine = function

            def function(*args: Any, **kwargs: Any) -> Any:
                return asyncio.run(coroutine(*args, **kwargs))

        return functools.partial(function, ctx) if self.takes_context else function

    def run(
        self,
        ctx_factory: Callable[[int], ToolContext],
        arguments: Any,
        transient: TransientRetry = NO_TRANSIENT_RETRY,
    ) -> ToolOutcome:
        """Validate, then call the function: again after a retryable ToolError (up to
        `retries` times), and again after an infrastructure error as `transient` says
        (idempotent tools only: a call that is not may have had its effect before the
        error). LeaseLost (a fenced write refused) is raised: the run stops."""
        try:
            args = self.validate(arguments)
        except ToolError as exc:
            return ToolOutcome(ok=False, error=str(exc), failure="tool")
        attempt = 0
        retried: list[str] = []
        first_transient: float | None = None

        def failed(error: str, failure: str) -> ToolOutcome:
            return ToolOutcome(
                ok=False,
                error=error,
                attempts=attempt,
                attempt_errors=tuple(retried),
                failure=failure,
            )

        while True:
            attempt += 1
            ctx = ctx_factory(attempt)  # raises LeaseLost when the run may not start it
            try:
                output = _call_with_timeout(self._bound(ctx), args, self.timeout)
                return ToolOutcome(
                    ok=True,
                    output=output,
                    attempts=attempt,
                    attempt_errors=tuple(retried),
                    memory_added=tuple(ctx.memory_added),
                    plan_update=tuple(ctx.plan_update) if ctx.plan_update is not None else None,
                    batch_cursor=ctx.batch_cursor,
                    agent_state=ctx.state_patch(),
                )
            except LeaseLost:
                raise
            except ToolError as exc:
                if exc.retryable and attempt <= self.retries:
                    retried.append(str(exc))
                    time.sleep(self.retry_backoff * (2 ** (attempt - 1)))
                    continue
                return failed(str(exc), "tool")
            except _Overrun:
                return failed(f"{self.name} timed out after {self.timeout:g}s", "timeout")
            except Exception as exc:  # a tool's bug is the model's problem to see, not a crash
                error = f"{self.name} raised {type(exc).__name__}: {exc}".strip()
                if not transient.is_transient(exc):
                    return failed(error, "tool")
                now = time.monotonic()
                first_transient = now if first_transient is None else first_transient
                transient_tries = sum(1 for e in retried if e.startswith(INFRASTRUCTURE_PREFIX))
                delay = min(transient.backoff * (2**transient_tries), transient.backoff_max)
                if self.idempotent and now + delay - first_transient <= transient.retry_for:
                    retried.append(f"{INFRASTRUCTURE_PREFIX}{error}")
                    time.sleep(delay)
                    continue
                why = "" if self.idempotent else " (not retried: the tool is not idempotent)"
                return failed(f"{INFRASTRUCTURE_PREFIX}{error}{why}", "infrastructure")


# The errors of infrastructure failures start with this, in the trace and the model's view.
INFRASTRUCTURE_PREFIX = "infrastructure error: "


# Tool calls run on worker threads, for their timeout. Idle threads are reused: starting a
# thread per call (and waiting for it to be scheduled) cost more than a whole durable step
# on a busy two-core machine. A call that overruns keeps its thread and the next call gets
# another one; with every thread busy, a call gets a thread of its own, as before, so no call
# ever waits in a queue (its timeout would run while it waited, and it would start late).
_TOOL_THREADS = 64
_executor_lock = threading.Lock()
_executor: tuple[int, concurrent.futures.ThreadPoolExecutor] | None = None
_busy = 0


def _shared_executor() -> concurrent.futures.ThreadPoolExecutor | None:
    """The process's pool, or None when all its threads are busy. Per process id: a forked
    child (RQ's work horse) must not inherit its parent's threads."""
    global _executor, _busy
    with _executor_lock:
        if _executor is None or _executor[0] != os.getpid():
            pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=_TOOL_THREADS, thread_name_prefix="tool"
            )
            _executor, _busy = (os.getpid(), pool), 0
        if _busy >= _TOOL_THREADS:
            return None
        _busy += 1
        return _executor[1]


def _release_thread(_: concurrent.futures.Future | None) -> None:
    global _busy
    with _executor_lock:
        _busy -= 1


class _Overrun(Exception):
    """A tool call overran its timeout (a TimeoutError the tool raises is its own)."""


def _call_with_timeout(function: Callable[..., Any], args: dict, timeout: float):
    # A thread cannot be killed: a tool that overruns keeps running in the background, but
    # the loop moves on and records the timeout. Tools with side effects should honour
    # their own timeouts too.
    shared = _shared_executor()
    pool = shared or concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tool")
    try:
        try:
            future = pool.submit(function, **args)
        except BaseException:
            if shared is not None:
                _release_thread(None)
            raise
        if shared is not None:
            future.add_done_callback(_release_thread)
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            if future.done() and isinstance(future.exception(), TimeoutError):
                raise  # the tool's own TimeoutError (a socket's, say), not an overrun
            raise _Overrun from None
    finally:
        if shared is None:
            pool.shutdown(wait=False)


def _takes_context(param: inspect.Parameter) -> bool:
    annotation = param.annotation
    return (
        annotation is ToolContext
        or (isinstance(annotation, str) and annotation.rsplit(".", 1)[-1] == "ToolContext")
        or param.name in ("ctx", "context")
    )


def tool(
    function: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    needs_approval: bool = False,
    idempotent: bool = True,
    timeout: float = 30.0,
    retries: int = 0,
) -> Any:
    """Make a Tool from a typed function (see the module docstring).

    idempotent: the tool honours `ctx.idempotency_key`, so running a call again after a
    crash does no harm; False: after a crash mid-call a person decides (run again, record
    what happened, or fail). needs_approval: every call waits for a person to approve it.
    timeout: seconds one attempt may take. retries: further attempts after a
    `ToolError(retryable=True)`."""

    # The decorating code's local names: a tool defined inside a function (with postponed
    # annotations) names types imported there, as pydantic models may.
    caller = sys._getframe(1)
    local_names = dict(caller.f_locals) if caller.f_code.co_name != "<module>" else None
    del caller

    def build(fn: Callable[..., Any]) -> Tool:
        label = getattr(fn, "__qualname__", repr(fn))
        if not callable(fn):
            raise TypeError(f"@tool needs a function, got {type(fn).__name__}")
        if not (isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0):
            raise TypeError(f"tool {label}: timeout must be a positive number of seconds")
        if not (isinstance(retries, int) and not isinstance(retries, bool) and retries >= 0):
            raise TypeError(f"tool {label}: retries must be an integer >= 0")
        params = list(inspect.signature(fn).parameters.values())
        takes_context = bool(params) and _takes_context(params[0])
        fields: dict[str, Any] = {}
        hints = _type_hints(fn, label, local_names)
        for param in params[1:] if takes_context else params:
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TypeError(
                    f"tool {label}: *{param.name} cannot be described to a model; "
                    "name each parameter"
                )
            if param.name not in hints:
                raise TypeError(f"tool {label}: parameter {param.name!r} needs a type hint")
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[param.name] = (hints[param.name], default)
        try:
            model = pydantic.create_model(
                f"{fn.__name__}_arguments",
                __config__=pydantic.ConfigDict(extra="forbid"),
                **fields,
            )
            model.model_json_schema()
        except (pydantic.PydanticUserError, pydantic.PydanticSchemaGenerationError) as exc:
            first = str(exc).splitlines()[0]
            raise TypeError(
                f"tool {label}: its parameters cannot become a JSON schema: {first}"
            ) from None
        doc = description if description is not None else inspect.getdoc(fn) or ""
        made = Tool(
            name=name or fn.__name__,
            description=doc.split("\n\n")[0],
            function=fn,
            arguments_model=model,
            takes_context=takes_context,
            needs_approval=needs_approval,
            idempotent=idempotent,
            timeout=timeout,
            retries=retries,
        )
        made.spec  # noqa: B018 - built now, so a bad schema fails at import, not at run time
        return made

    return build(function) if function is not None else build


def _type_hints(
    fn: Callable[..., Any], label: str, local_names: dict[str, Any] | None
) -> dict[str, Any]:
    try:
        # include_extras keeps Annotated[int, Field(gt=0)] constraints for the schema.
        return typing.get_type_hints(fn, localns=local_names, include_extras=True)
    except Exception as exc:  # a forward reference that does not resolve
        raise TypeError(f"tool {label}: its type hints cannot be read: {exc}") from None


class ToolRegistry:
    def __init__(self, tools: list[Tool] | None = None) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools or []:
            self.add(t)

    def add(self, t: Tool) -> None:
        if t.name in self._tools:
            raise ValueError(f"tool {t.name!r} registered twice")
        self._tools[t.name] = t

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def specs(self) -> list[ToolSpec]:
        return [t.spec for t in self._tools.values()]

    def __iter__(self):
        return iter(self._tools.values())
