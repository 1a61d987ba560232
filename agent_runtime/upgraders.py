"""Versioned loaders for stored blobs.

Every read of a checkpoint state or a step payload goes through `load_state` /
`load_step_payload`. Each released version gets a pure upgrader `vN -> vN+1` in
`STATE_UPGRADERS` / `STEP_UPGRADERS`; released upgraders are never edited. A blob from a
version newer than this code knows is refused with `IncompatibleSchemaError`, never
half-read; so is a blob that does not have the shape its version promises.

Version 1: the first released shape (the durable spine, commit 56724ab).
  state:   {"schema_version": 1, "agent": {"name", "version"}, "turn",
            "plan": [{"title", "status"}], "memory_refs": [str],
            "counters": {"steps", "model_calls", "tool_calls", "tokens_in", "tokens_out",
                         "cost", "retries"},
            "budgets": {"max_steps", "max_tokens", "max_cost"},
            "pending_approval": null | {"call_id", "tool", "arguments", "model_seq",
                                        "requested_at"},
            "uncertain_calls": [str], "batch_cursor", "final_answer"}
  steps:   user {"text"}
           model {"text": str | null, "tool_calls": [{"id", "name", "arguments"}], "usage",
                  "model"}
           tool_call {"call_id", "name", "arguments"}
           tool_result {"call_id", "name", "ok": bool, "output", "error", "attempts",
                        "plan_update"?: [[title, status]], "memory_added"?: [str]}
           error {"where", "error", "attempts"?, "permanent"?, ...}
           operator {"action", "actor", ...}; an instruction is {"action": "instruction",
                    "text", ...}
           system {"event", ...}

Version 2: content parts, tool result status, plan item ids, grouped counters.
  state:   as v1, except
           "plan": [{"id": "p1", "title", "status"}]   (ids survive plan updates)
           "counters": {"steps", "model": {"calls", "tokens_in", "tokens_out", "cost"},
                        "tools": {"calls", "retries"}}
  steps:   user {"content": [{"type": "text", "text"}]}
           model {"content": [parts] (empty: no text), "tool_calls": [{"id", "name",
                  "arguments"}], "usage", "model"}
           tool_result {"call_id", "name", "status": "ok" | "error", "output", "error",
                        "attempts", "plan_update"?: [{"title", "status"}],
                        "memory_added"?: [str]}
           operator instruction {"action": "instruction", "content": [parts], ...}
           tool_call, error, system and other operator payloads: unchanged.
  What a model sees (`loop.build_messages`) is identical for a v1 blob and its upgrade.

Version 3: the agent's own state (agents declare it with `AgentState`).
  state:   as v2, plus "agent_state": null | {"version": int >= 1, "data": {...}}
  steps:   tool_result as v2, plus "agent_state"?: {"version", "set": {...}, "unset": [str]}
           (the top-level keys the call changed in the agent state)
           system run_started as v2, plus "agent_version"? and "agent_state"? (the whole
           agent state when the run started it or upgraded it)
           everything else: unchanged.
  What a model sees is unchanged: the agent state is never shown to it.

Each step's version is stored beside its payload (Step.schema_version); a state blob carries
its own "schema_version". Step upgraders take the step's kind as well as its payload.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .state import SCHEMA_VERSION, SessionState, StateError, validate_step_payload

StateUpgrader = Callable[[dict[str, Any]], dict[str, Any]]
StepUpgrader = Callable[[str, dict[str, Any]], dict[str, Any]]


class IncompatibleSchemaError(Exception):
    """A stored blob cannot be loaded by this code (too new, no upgrade path, or not the
    shape its version promises). `where` names the blob: "checkpoint at seq 7"."""

    def __init__(
        self,
        message: str,
        *,
        found: Any,
        supported: int = SCHEMA_VERSION,
        where: str | None = None,
    ):
        super().__init__(f"{where}: {message}" if where else message)
        self.detail = message
        self.problem = message
        self.found = found
        self.supported = supported
        self.where = where

    def at(self, where: str) -> IncompatibleSchemaError:
        """The same error, saying which blob it is about."""
        return IncompatibleSchemaError(
            self.detail, found=self.found, supported=self.supported, where=where
        )


# --- v1 <-> v2 (released: never edit) ---------------------------------------------------
# Self-contained on purpose: they must keep giving the same output whatever the current
# version's helpers in state.py become.

_V1_TEXT_KINDS = ("user", "model")


def state_v1_to_v2(blob: dict[str, Any]) -> dict[str, Any]:
    counters = blob["counters"]
    out = {k: v for k, v in blob.items() if k not in ("plan", "counters")}
    out["schema_version"] = 2
    # v1 loaded plan items by position; their ids are their positions.
    out["plan"] = [
        {"id": f"p{n}", "title": item["title"], "status": item["status"]}
        for n, item in enumerate(blob["plan"], start=1)
    ]
    # v1 filled missing counters with their defaults; so does the upgrade.
    out["counters"] = {
        "steps": counters.get("steps", 0),
        "model": {
            "calls": counters.get("model_calls", 0),
            "tokens_in": counters.get("tokens_in", 0),
            "tokens_out": counters.get("tokens_out", 0),
            "cost": counters.get("cost", 0.0),
        },
        "tools": {"calls": counters.get("tool_calls", 0), "retries": counters.get("retries", 0)},
    }
    return out


def _text_v1(payload: dict[str, Any], kind: str) -> str | None:
    text = payload.get("text")
    if text is not None and not isinstance(text, str):
        raise StateError(f"{kind} text must be a string, got {type(text).__name__}")
    return text


def _has_text_v1(kind: str, payload: dict[str, Any]) -> bool:
    return kind in _V1_TEXT_KINDS or (kind == "operator" and payload.get("action") == "instruction")


def step_v1_to_v2(kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    if _has_text_v1(kind, payload):
        text = _text_v1(payload, kind)
        out = {k: v for k, v in payload.items() if k != "text"}
        out["content"] = [] if text is None else [{"type": "text", "text": text}]
        if kind == "model":
            out["tool_calls"] = list(payload.get("tool_calls") or [])
        return out
    if kind == "tool_result":
        ok = payload["ok"]
        if not isinstance(ok, bool):
            raise StateError(f"tool_result ok must be true or false, got {ok!r}")
        out = {k: v for k, v in payload.items() if k != "ok"}
        out["status"] = "ok" if ok else "error"
        out.setdefault("output", None)
        out.setdefault("error", None)
        out["attempts"] = payload.get("attempts", 1)  # what v1 assumed when it was missing
        if payload.get("plan_update") is not None:
            out["plan_update"] = [
                {"title": title, "status": status} for title, status in payload["plan_update"]
            ]
        return out
    return dict(payload)


def state_v2_to_v1(blob: dict[str, Any]) -> dict[str, Any]:
    """Back to v1 for a reversed migration. Loses only the plan item ids."""
    counters = blob["counters"]
    out = {k: v for k, v in blob.items() if k not in ("plan", "counters")}
    out["schema_version"] = 1
    out["plan"] = [{"title": p["title"], "status": p["status"]} for p in blob["plan"]]
    out["counters"] = {
        "steps": counters["steps"],
        "model_calls": counters["model"]["calls"],
        "tool_calls": counters["tools"]["calls"],
        "tokens_in": counters["model"]["tokens_in"],
        "tokens_out": counters["model"]["tokens_out"],
        "cost": counters["model"]["cost"],
        "retries": counters["tools"]["retries"],
    }
    return out


def step_v2_to_v1(kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Back to v1 for a reversed migration; lossless for everything v2 can hold."""
    if _has_text_v1(kind, payload):
        out = {k: v for k, v in payload.items() if k != "content"}
        texts = [part["text"] for part in payload["content"]]
        out["text"] = "\n".join(texts) if texts else None
        return out
    if kind == "tool_result":
        out = {k: v for k, v in payload.items() if k != "status"}
        out["ok"] = payload["status"] == "ok"
        if payload.get("plan_update") is not None:
            out["plan_update"] = [[p["title"], p["status"]] for p in payload["plan_update"]]
        return out
    return dict(payload)


# --- v2 <-> v3 (released: never edit) ---------------------------------------------------


def state_v2_to_v3(blob: dict[str, Any]) -> dict[str, Any]:
    # No agent kept state of its own before v3.
    return {**blob, "schema_version": 3, "agent_state": None}


def step_v2_to_v3(kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    # v3 only adds optional keys: every v2 payload is a valid v3 payload.
    return dict(payload)


def state_v3_to_v2(blob: dict[str, Any]) -> dict[str, Any]:
    """Back to v2 for a reversed migration. Loses the agent's own state."""
    out = {k: v for k, v in blob.items() if k != "agent_state"}
    out["schema_version"] = 2
    return out


def step_v3_to_v2(kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Back to v2 for a reversed migration. Loses the agent state changes of tool results
    and run starts."""
    if kind in ("tool_result", "system"):
        return {k: v for k, v in payload.items() if k != "agent_state"}
    return dict(payload)


# from_version -> the blob at from_version + 1
STATE_UPGRADERS: dict[int, StateUpgrader] = {1: state_v1_to_v2, 2: state_v2_to_v3}
STEP_UPGRADERS: dict[int, StepUpgrader] = {1: step_v1_to_v2, 2: step_v2_to_v3}
# from_version -> the blob at from_version - 1 (used only to reverse a data migration)
STATE_DOWNGRADERS: dict[int, StateUpgrader] = {2: state_v2_to_v1, 3: state_v3_to_v2}
STEP_DOWNGRADERS: dict[int, StepUpgrader] = {2: step_v2_to_v1, 3: step_v3_to_v2}


# --- Loading ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Loaded:
    value: Any
    stored_version: int
    applied: tuple[str, ...]


def _check_version(version: Any, what: str) -> int:
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
    return version


def _chain(
    blob: dict[str, Any],
    version: int,
    step: Callable[[int, dict[str, Any]], dict[str, Any]],
    target: int = SCHEMA_VERSION,
) -> tuple[dict[str, Any], tuple[str, ...]]:
    applied = []
    current = version
    while current < target:
        blob = step(current, blob)
        applied.append(f"v{current}->v{current + 1}")
        current += 1
    return blob, tuple(applied)


def _malformed(what: str, version: int, exc: Exception) -> IncompatibleSchemaError:
    detail = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
    error = IncompatibleSchemaError(
        f"{what} (stored at schema version {version}) cannot be read: {detail}", found=version
    )
    # What a person fixes, without the chain of what could not read it.
    error.problem = getattr(exc, "problem", detail)
    return error


def upgrade_state_blob(blob: Any, target: int = SCHEMA_VERSION) -> Loaded:
    """A stored state blob at the current version (value: a dict), checked to load.

    With an older `target` (a released data migration that rewrote blobs to its own
    version), the chain stops there; only the current version's shape can be checked."""
    if not isinstance(blob, dict):
        raise IncompatibleSchemaError("checkpoint state is not a JSON object", found=None)
    version = _check_version(blob.get("schema_version"), "checkpoint state")

    def step(current: int, value: dict[str, Any]) -> dict[str, Any]:
        upgrader = STATE_UPGRADERS.get(current)
        if upgrader is None:
            raise IncompatibleSchemaError(
                f"checkpoint state: no upgrader from schema version {current}", found=version
            )
        return upgrader(value)

    try:
        value, applied = _chain(dict(blob), version, step, target)
        if target == SCHEMA_VERSION:
            SessionState.from_dict(value)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _malformed("checkpoint state", version, exc) from exc
    return Loaded(value=value, stored_version=version, applied=applied)


def load_state(blob: Any) -> Loaded:
    """Upgrade a stored state blob and build the SessionState (value)."""
    loaded = upgrade_state_blob(blob)
    return Loaded(
        value=SessionState.from_dict(loaded.value),
        stored_version=loaded.stored_version,
        applied=loaded.applied,
    )


def load_step_payload(
    kind: str, payload: Any, version: Any, target: int = SCHEMA_VERSION
) -> Loaded:
    """Upgrade a stored step payload; the step's schema version lives beside the payload.
    `target`: as for upgrade_state_blob."""
    version = _check_version(version, f"{kind} step payload")
    if not isinstance(payload, dict):
        raise IncompatibleSchemaError(f"{kind} step payload is not a JSON object", found=version)

    def step(current: int, value: dict[str, Any]) -> dict[str, Any]:
        upgrader = STEP_UPGRADERS.get(current)
        if upgrader is None:
            raise IncompatibleSchemaError(
                f"{kind} step payload: no upgrader from schema version {current}", found=version
            )
        return upgrader(kind, value)

    try:
        value, applied = _chain(dict(payload), version, step, target)
        if target == SCHEMA_VERSION:
            validate_step_payload(kind, value)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _malformed(f"{kind} step payload", version, exc) from exc
    return Loaded(value=value, stored_version=version, applied=applied)


# --- Going back (a reversed data migration) ---------------------------------------------


def downgrade_state_blob(blob: dict[str, Any], from_version: int) -> dict[str, Any]:
    """A state blob at `from_version`, one version down."""
    if blob.get("schema_version") != from_version:
        raise IncompatibleSchemaError(
            f"checkpoint state is at {blob.get('schema_version')!r}, not {from_version}",
            found=blob.get("schema_version"),
        )
    try:
        return STATE_DOWNGRADERS[from_version](dict(blob))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _malformed("checkpoint state", from_version, exc) from exc


def downgrade_step_payload(kind: str, payload: dict[str, Any], from_version: int) -> dict[str, Any]:
    """A step payload at `from_version`, one version down."""
    try:
        return STEP_DOWNGRADERS[from_version](kind, dict(payload))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _malformed(f"{kind} step payload", from_version, exc) from exc
