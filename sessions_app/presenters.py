"""Turn stored rows into what the dashboard shows. The one place that knows payload shapes
on the view side, so templates never poke at JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agent_runtime.state import step_text, tool_ok
from agent_runtime.upgraders import IncompatibleSchemaError, load_step_payload

from .models import Step

LONG_TEXT = 600  # characters before a block is collapsed behind "show all"


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


@dataclass
class Block:
    label: str
    text: str
    is_json: bool = False

    @property
    def is_message(self) -> bool:
        """What was said (by the user, the model or an operator), not data."""
        return self.label in ("message", "text", "instruction")

    @property
    def is_long(self) -> bool:
        return len(self.text) > LONG_TEXT or self.text.count("\n") > 12

    @property
    def preview(self) -> str:
        first = self.text[:LONG_TEXT]
        lines = first.split("\n")[:12]
        return "\n".join(lines)


@dataclass
class StepView:
    step: Step
    headline: str
    blocks: list[Block] = field(default_factory=list)
    tone: str = ""  # "", "error", "ok", "warn"
    duration_ms: float | None = None
    checkpoint_reasons: list[str] = field(default_factory=list)
    load_error: str = ""
    branch: str = ""  # "3/8": the tool call or result of a fan-out branch, and how many ran

    @property
    def seq(self) -> int:
        return self.step.seq


def branch_label(kind: str, payload: Any) -> str:
    """The fan-out branch label ("3/8") of a tool call or result; "" for anything else."""
    branch = payload.get("branch") if isinstance(payload, dict) else None
    if kind not in ("tool_call", "tool_result") or not isinstance(branch, dict):
        return ""
    return f"{branch.get('index')}/{branch.get('of')}"


def _text(payload: dict[str, Any]) -> str:
    return step_text(payload) or ""


def present_step(step: Step, checkpoint_reasons: list[str] | None = None) -> StepView:
    """The step as a person reads it, its payload loaded (upgraded) as a worker would; a
    payload this code cannot load is shown raw, with the reason."""
    load_error = ""
    try:
        payload = load_step_payload(step.kind, step.payload, step.schema_version).value
    except IncompatibleSchemaError as exc:
        load_error = str(exc)
        payload = step.payload if isinstance(step.payload, dict) else {"value": step.payload}
    kind = step.kind
    view = StepView(
        step=step, headline=kind, checkpoint_reasons=checkpoint_reasons or [], load_error=load_error
    )
    if load_error:
        view.tone = "error"
        view.blocks.append(Block("stored payload", pretty(step.payload), True))
        return view
    view.branch = branch_label(kind, payload)
    if step.started_at and step.finished_at:
        view.duration_ms = max((step.finished_at - step.started_at).total_seconds() * 1000, 0.0)
    if kind == "user":
        view.headline = "User"
        view.blocks.append(Block("message", _text(payload)))
    elif kind == "model":
        calls = payload.get("tool_calls") or []
        view.headline = f"Model · {payload.get('model', '')}".rstrip(" ·")
        if _text(payload):
            view.blocks.append(Block("text", _text(payload)))
        for call in calls:
            view.blocks.append(
                Block(
                    f"calls {call.get('name')} ({call.get('id')})",
                    pretty(call.get("arguments")),
                    True,
                )
            )
        if not calls:
            view.tone = "ok"
    elif kind == "tool_call":
        view.headline = f"Tool call · {payload.get('name')}"
        view.blocks.append(Block("arguments", pretty(payload.get("arguments")), True))
        if step.idempotency_key:
            view.blocks.append(Block("idempotency key", step.idempotency_key))
    elif kind == "tool_result":
        ok = tool_ok(payload)
        attempts = payload.get("attempts", 1)
        view.headline = f"Tool result · {payload.get('name')} · {'ok' if ok else 'error'}"
        if attempts and attempts > 1:
            view.headline += f" · {attempts} attempts"
        view.tone = "" if ok else "error"
        if payload.get("error"):
            view.blocks.append(Block("error", str(payload["error"])))
        if payload.get("output") is not None:
            view.blocks.append(Block("output", pretty(payload.get("output")), True))
    elif kind == "error":
        view.headline = f"Error · {payload.get('where', '')}".rstrip(" ·")
        view.tone = "error"
        view.blocks.append(Block("error", str(payload.get("error", ""))))
        details = {k: v for k, v in payload.items() if k not in ("where", "error")}
        if details:
            view.blocks.append(Block("details", pretty(details), True))
    elif kind == "operator":
        action = payload.get("action") or "edit"
        view.headline = f"Operator · {action} · by {payload.get('actor', 'someone')}"
        view.tone = "warn"
        if payload.get("action") == "instruction":
            view.blocks.append(Block("instruction", _text(payload)))
        details = {k: v for k, v in payload.items() if k not in ("action", "actor", "content")}
        if details:
            view.blocks.append(Block("details", pretty(details), True))
    else:
        view.headline = f"System · {payload.get('event', '')}".rstrip(" ·")
        details = {k: v for k, v in payload.items() if k != "event"}
        if details:
            view.blocks.append(Block("details", pretty(details), True))
    return view


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """JSON flattened to path -> leaf, for diffs."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key in sorted(value):
            out.update(flatten(value[key], f"{prefix}.{key}" if prefix else str(key)))
        return out or {prefix: {}}
    if isinstance(value, list):
        out = {}
        for index, item in enumerate(value):
            out.update(flatten(item, f"{prefix}[{index}]"))
        return out or {prefix: []}
    return {prefix: value}


@dataclass(frozen=True)
class DiffLine:
    path: str
    change: str  # added | removed | changed
    before: str
    after: str


def diff_states(before: Any, after: Any) -> list[DiffLine]:
    a, b = flatten(before), flatten(after)
    lines = []
    for path in sorted(set(a) | set(b)):
        if path not in a:
            lines.append(DiffLine(path, "added", "", json.dumps(b[path], default=str)))
        elif path not in b:
            lines.append(DiffLine(path, "removed", json.dumps(a[path], default=str), ""))
        elif a[path] != b[path]:
            lines.append(
                DiffLine(
                    path,
                    "changed",
                    json.dumps(a[path], default=str),
                    json.dumps(b[path], default=str),
                )
            )
    return lines
