"""The demo agents: offline, driven by deterministic scripted models.

A package of agents like any team's own: it uses only the engine's public API
(`agent_runtime`) and is found the same way, through `RESPAWN_AGENTS` (the default,
`demo_agents:agents`, loads it; a deployment that sets `RESPAWN_AGENTS` without it runs
none of them). Its knobs are environment variables of its own, read when `agents()` is
called: `RESPAWN_SLOW_DELAY`, `RESPAWN_BATCH_DELAY`, `RESPAWN_RESEARCH_DELAY`,
`RESPAWN_RESEARCH_PARALLEL`.
"""

from __future__ import annotations

import ast
import operator
import os
import time
from typing import Any

from agent_runtime import Agent, AgentRegistry, Limits, Tool, ToolContext, ToolError, tool

from . import scripts  # noqa: F401 - registers the scripted:<agent> models

# --- Demo tools -------------------------------------------------------------------------

_OPERATORS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _evaluate(node: ast.AST) -> float | int:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ToolError("exponent too large")
        return _OPERATORS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    raise ToolError(f"unsupported expression element: {type(node).__name__}")


@tool
def calculator(ctx: ToolContext, expression: str) -> dict[str, Any]:
    """Evaluate an arithmetic expression (+ - * / // % ** and parentheses)."""
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        raise ToolError(f"not an arithmetic expression: {expression!r}") from None
    try:
        value = _evaluate(tree)
    except ZeroDivisionError:
        raise ToolError("division by zero") from None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return {"expression": expression, "value": value}


@tool
def update_plan(ctx: ToolContext, items: list[str], done: int = 0) -> dict[str, Any]:
    """Set the plan: its items in order, and how many of them are done."""
    if done < 0 or done > len(items):
        raise ToolError(f"done must be between 0 and {len(items)}")
    statuses = [
        (title, "done" if i < done else "in_progress" if i == done else "pending")
        for i, title in enumerate(items)
    ]
    ctx.set_plan(statuses)
    return {"plan": [{"title": t, "status": s} for t, s in statuses]}


@tool
def save_note(ctx: ToolContext, text: str) -> dict[str, Any]:
    """Save a short note; returns its id. Honours the idempotency key."""
    if not text.strip():
        raise ToolError("a note needs some text")
    note_id = f"note-{ctx.session_id}-{ctx.call_id}"
    with ctx.fenced():  # a run that lost the session writes nothing
        ctx.effects.record(
            ctx.idempotency_key, session_id=ctx.session_id, tool="save_note", payload={"text": text}
        )
    ctx.remember(note_id)
    return {"note": note_id}


def make_tick(delay: float) -> Tool:
    @tool(name="tick")
    def tick(ctx: ToolContext, n: int) -> dict[str, Any]:
        """Count one tick: waits a moment, then writes a side-effect row keyed by the call."""
        time.sleep(delay)
        with ctx.fenced():
            ctx.effects.record(
                ctx.idempotency_key, session_id=ctx.session_id, tool="tick", payload={"n": n}
            )
        return {"n": n}

    return tick


@tool(retries=3)
def flaky_fetch(ctx: ToolContext, resource: str) -> dict[str, Any]:
    """Fetch a resource from a service that fails the first two attempts of every call."""
    if ctx.attempt <= 2:
        raise ToolError(
            f"{resource}: 503 service unavailable (attempt {ctx.attempt})", retryable=True
        )
    return {"resource": resource, "body": "all systems nominal"}


@tool(needs_approval=True, idempotent=False)
def send_payment(ctx: ToolContext, recipient: str, amount_cents: int, memo: str = "") -> dict:
    """Send a payment. Moves real money, so a person must approve each call."""
    if amount_cents <= 0:
        raise ToolError("amount_cents must be positive")
    with ctx.fenced():
        ctx.effects.record(
            ctx.idempotency_key,
            session_id=ctx.session_id,
            tool="send_payment",
            payload={"recipient": recipient, "amount_cents": amount_cents, "memo": memo},
        )
    return {"reference": f"pay-{ctx.session_id}-{ctx.call_id}", "recipient": recipient}


def make_send_notification(delay: float) -> Tool:
    @tool(name="send_notification", idempotent=False)
    def send_notification(ctx: ToolContext, to: str, text: str) -> dict[str, Any]:
        """Send a notification. Not idempotent: the receiving service ignores the key, so
        after a crash nobody can tell whether it went out."""
        ctx.report_progress(0, 1, f"sending to {to}")
        time.sleep(delay)
        # The notification is a row in the demo's database: tied to the run's fence, a run
        # that lost the session (it froze past its lease, say) cannot send it late.
        with ctx.fenced():
            ctx.effects.record(
                ctx.idempotency_key,
                session_id=ctx.session_id,
                tool="send_notification",
                payload={"to": to, "text": text},
            )
        return {"message_id": f"msg-{ctx.session_id}-{ctx.call_id}", "to": to}

    return send_notification


MAX_BATCH = 10_000


def make_migrate_batch(delay: float) -> Tool:
    @tool(name="migrate_batch", timeout=600)
    def migrate_batch(ctx: ToolContext, cursor: int, size: int, total: int) -> dict[str, Any]:
        """Migrate the records after `cursor` (up to `size` of them) out of `total`; returns
        the next cursor. Honours the idempotency key: a batch run again migrates nothing
        twice."""
        time.sleep(delay)  # reading the batch from a slow source
        return _migrate_batch(ctx, cursor, size, total)

    return migrate_batch


def _migrate_batch(ctx: ToolContext, cursor: int, size: int, total: int) -> dict[str, Any]:
    if ctx.records is None:
        raise ToolError("no record source is configured on this worker")
    if not 0 < size <= MAX_BATCH:
        raise ToolError(f"size must be between 1 and {MAX_BATCH}")
    if not 0 <= cursor <= total:
        raise ToolError(f"cursor must be between 0 and total ({total})")
    # The session's own dataset: created on first use, the same records on every re-run.
    ctx.records.ensure(ctx.session_id, total)
    with ctx.fenced():
        outcome = ctx.records.migrate_batch(
            ctx.idempotency_key,
            dataset=ctx.session_id,
            start=cursor,
            size=min(size, total - cursor),
        )
    ctx.set_batch_cursor({"done": outcome.end, "total": total, "size": size})
    return {**outcome.to_dict(), "total": total}


def make_lookup(delay: float) -> Tool:
    @tool(name="lookup", timeout=60)
    def lookup(ctx: ToolContext, source: str, query: str) -> dict[str, Any]:
        """Look a query up in one source of the local corpus: its matching lines."""
        from . import corpus

        time.sleep(delay)  # a remote source's latency
        try:
            found = corpus.search(source, query)
        except KeyError:
            raise ToolError(f"no source {source!r}") from None
        return {"source": source, "query": query, "lines": found}

    return lookup


@tool(timeout=3600)
def crash_worker(ctx: ToolContext) -> dict[str, Any]:
    """Kill the worker process running it, as a segfaulting native library would."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)
    return {}  # never reached


def build(
    *,
    slow_delay: float = 0.5,
    batch_delay: float = 0.0,
    research_delay: float = 0.2,
    research_parallel: int = 8,
) -> list[Agent]:
    """The offline demo agents; `slow_delay` is the seconds each `tick` takes,
    `batch_delay` the seconds each `migrate_batch` waits before migrating,
    `research_delay` the seconds each `lookup` takes and `research_parallel` how many
    lookups of one turn run at once."""
    return [
        Agent(
            name="demo",
            version="1",
            description=(
                "Plans, calculates and saves a note: 'what is (12*7)+3, then save it as a note'."
            ),
            model="scripted:demo",
            instructions="You are a careful assistant. Plan first, use tools, then answer.",
            tools=[update_plan, calculator, save_note],
            limits=Limits(max_steps=50),
        ),
        Agent(
            name="slow",
            version="1",
            description="'count to N': N turns, each calling a slow tick tool (side effect).",
            model="scripted:slow",
            instructions="Count, one tick per turn.",
            tools=[make_tick(slow_delay)],
            limits=Limits(max_steps=40_000),
        ),
        Agent(
            name="flaky",
            version="1",
            description="Calls a tool that fails transiently and succeeds on retry.",
            model="scripted:flaky",
            instructions="Fetch the status page and report it.",
            tools=[flaky_fetch],
            limits=Limits(max_steps=20),
        ),
        Agent(
            name="approval",
            version="1",
            description="Asks to send a payment; waits for a person to approve or reject it.",
            model="scripted:approval",
            instructions="Pay the invoice the user describes.",
            tools=[send_payment],
            limits=Limits(max_steps=20),
        ),
        Agent(
            name="notify",
            version="1",
            description="Sends one notification: a side effect that is not idempotent.",
            model="scripted:notify",
            instructions="Send the notification the user asks for.",
            tools=[make_send_notification(slow_delay)],
            limits=Limits(max_steps=20),
        ),
        Agent(
            name="poison",
            version="1",
            description="Calls a tool that kills its worker every time (a poison session).",
            model="scripted:poison",
            instructions="Run the bad tool.",
            tools=[crash_worker],
            limits=Limits(max_steps=20),
        ),
        Agent(
            name="migrate",
            version="1",
            description=(
                "'migrate N records in batches of B': one tool call per batch over a "
                "table of its own, a checkpoint after each batch, progress done/total."
            ),
            model="scripted:migrate",
            instructions="Migrate the records in batches; one batch per turn.",
            tools=[make_migrate_batch(batch_delay)],
            limits=Limits(max_steps=400_000),
        ),
        Agent(
            name="research",
            version="1",
            description=(
                "'research checkpoints in 8 sources': N lookups over a local corpus, run "
                "in parallel as branch jobs, then a summary."
            ),
            model="scripted:research",
            instructions="Look the topic up in every source at once, then summarise.",
            tools=[make_lookup(research_delay)],
            limits=Limits(max_steps=200, max_parallel_tools=research_parallel),
        ),
        Agent(
            name="echo",
            version="1",
            description="Repeats what you say; a one-step conversation partner.",
            model="scripted:echo",
            instructions="Repeat the user.",
            limits=Limits(max_steps=20),
        ),
    ]


def demo_agents(**options: Any) -> AgentRegistry:
    """The demo agents as a registry (for tests and benches); options as for `build`."""
    return AgentRegistry(build(**options))


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        return float(raw) if raw.strip() else default
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None


def agents() -> list[Agent]:
    """The demo agents with the delays of this deployment's environment."""
    return build(
        slow_delay=_env_float("RESPAWN_SLOW_DELAY", 0.5),
        batch_delay=_env_float("RESPAWN_BATCH_DELAY", 0.0),
        research_delay=_env_float("RESPAWN_RESEARCH_DELAY", 0.2),
        research_parallel=int(_env_float("RESPAWN_RESEARCH_PARALLEL", 8)),
    )
