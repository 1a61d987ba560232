"""Tools: typed Python functions with a JSON schema, argument validation, idempotency keys.

    @tool(idempotent=True)
    def calculator(ctx: ToolContext, expression: str) -> dict: ...

The schema comes from the signature (pydantic). A tool that raises, gets invalid
arguments, times out or does not exist produces a `ToolOutcome` with ok=False: a result
the model sees, never a crash of the loop.
"""

from __future__ import annotations

import concurrent.futures
import functools
import inspect
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pydantic

from .records import RecordSource
from .store import EffectLedger


class ToolError(Exception):
    """Raised by a tool to report a failure; retryable ones are tried again."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass
class ToolContext:
    """What a running tool may know and use."""

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

    def payload(self, call_id: str, name: str) -> dict[str, Any]:
        """The tool_result step payload (current schema version)."""
        payload = {
            "call_id": call_id,
            "name": name,
            "status": "ok" if self.ok else "error",
            "output": self.output,
            "error": self.error,
            "attempts": self.attempts,
        }
        if self.attempt_errors:
            # Optional and for people (the trace lists each attempt); the model is not shown it.
            payload["attempt_errors"] = list(self.attempt_errors)
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

    def run(self, ctx_factory: Callable[[int], ToolContext], arguments: Any) -> ToolOutcome:
        """Validate, then call the function (with retries for retryable errors)."""
        try:
            args = self.validate(arguments)
        except ToolError as exc:
            return ToolOutcome(ok=False, error=str(exc))
        attempt = 0
        retried: list[str] = []
        while True:
            attempt += 1
            ctx = ctx_factory(attempt)
            try:
                output = _call_with_timeout(self.function, ctx, args, self.timeout)
                return ToolOutcome(
                    ok=True,
                    output=output,
                    attempts=attempt,
                    attempt_errors=tuple(retried),
                    memory_added=tuple(ctx.memory_added),
                    plan_update=tuple(ctx.plan_update) if ctx.plan_update is not None else None,
                    batch_cursor=ctx.batch_cursor,
                )
            except ToolError as exc:
                if exc.retryable and attempt <= self.retries:
                    retried.append(str(exc))
                    time.sleep(self.retry_backoff * (2 ** (attempt - 1)))
                    continue
                return ToolOutcome(
                    ok=False, error=str(exc), attempts=attempt, attempt_errors=tuple(retried)
                )
            except TimeoutError:
                return ToolOutcome(
                    ok=False,
                    error=f"{self.name} timed out after {self.timeout:g}s",
                    attempts=attempt,
                    attempt_errors=tuple(retried),
                )
            except Exception as exc:  # a tool's bug is the model's problem to see, not a crash
                return ToolOutcome(
                    ok=False,
                    error=f"{self.name} raised {type(exc).__name__}: {exc}",
                    attempts=attempt,
                    attempt_errors=tuple(retried),
                )


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


def _call_with_timeout(function: Callable[..., Any], ctx: ToolContext, args: dict, timeout: float):
    # A thread cannot be killed: a tool that overruns keeps running in the background, but
    # the loop moves on and records the timeout. Tools with side effects should honour
    # their own timeouts too.
    shared = _shared_executor()
    pool = shared or concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tool")
    try:
        try:
            future = pool.submit(function, ctx, **args)
        except BaseException:
            if shared is not None:
                _release_thread(None)
            raise
        if shared is not None:
            future.add_done_callback(_release_thread)
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError from None
    finally:
        if shared is None:
            pool.shutdown(wait=False)


def tool(
    function: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    needs_approval: bool = False,
    idempotent: bool = True,
    timeout: float = 30.0,
    retries: int = 0,
) -> Any:
    """Make a Tool from a typed function whose first parameter is the ToolContext."""

    def build(fn: Callable[..., Any]) -> Tool:
        signature = inspect.signature(fn)
        params = list(signature.parameters.values())
        if not params:
            raise TypeError(f"tool {fn.__name__} must take a ToolContext as first parameter")
        fields: dict[str, Any] = {}
        for param in params[1:]:
            if param.annotation is inspect.Parameter.empty:
                raise TypeError(f"tool {fn.__name__}: parameter {param.name} needs a type hint")
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[param.name] = (param.annotation, default)
        model = pydantic.create_model(
            f"{fn.__name__}_arguments",
            __config__=pydantic.ConfigDict(extra="forbid"),
            **fields,
        )
        doc = inspect.getdoc(fn) or ""
        return Tool(
            name=name or fn.__name__,
            description=doc.split("\n\n")[0],
            function=fn,
            arguments_model=model,
            needs_approval=needs_approval,
            idempotent=idempotent,
            timeout=timeout,
            retries=retries,
        )

    return build(function) if function is not None else build


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

    def specs(self) -> list[ToolSpec]:
        return [t.spec for t in self._tools.values()]

    def __iter__(self):
        return iter(self._tools.values())
