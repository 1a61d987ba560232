"""The conversation a model sees, rendered from the durable steps."""

from __future__ import annotations

import json
from typing import Any

from ..providers import Message, ToolCall
from ..state import (
    OperatorAction,
    OperatorPayload,
    StepKind,
    StepRecord,
    as_model,
    as_operator,
    as_tool_result,
    step_text,
    tool_ok,
)


def build_messages(system_prompt: str, history: list[StepRecord]) -> list[Message]:
    """The conversation a provider sees, rebuilt from durable steps only (already upgraded
    to the current schema). A session stored in an older version renders exactly as it did
    then: tests hold every version's fixtures to that."""
    return Conversation(system_prompt, history).messages


def _corrections(history: list[StepRecord]) -> dict[Any, OperatorPayload]:
    """The operators' corrections, by the seq of the tool result each one corrects."""
    corrections = (
        as_operator(s.payload) for s in history if s.action == OperatorAction.CORRECT_RESULT
    )
    return {correction.get("result_seq"): correction for correction in corrections}


def _step_message(step: StepRecord, corrections: dict[Any, OperatorPayload]) -> Message | None:
    """What one step shows the model, if anything."""
    payload = step.payload
    if step.kind == StepKind.USER:
        return Message(role="user", content=step_text(payload) or "")
    if step.kind == StepKind.MODEL:
        return Message(
            role="assistant",
            content=step_text(payload),
            tool_calls=tuple(ToolCall(**c) for c in as_model(payload).get("tool_calls") or []),
        )
    if step.kind == StepKind.TOOL_RESULT:
        tool_result = as_tool_result(payload)
        # The model has always been shown {"ok": bool, ...}; the stored status is mapped
        # back so sessions read the same to a model across the v1 -> v2 change.
        result = {
            "name": tool_result.get("name"),
            "ok": tool_ok(payload),
            "output": tool_result.get("output"),
            "error": tool_result.get("error"),
            "attempts": tool_result.get("attempts", 1),
        }
        if tool_result.get("recorded_by_operator"):
            result["recorded_by_operator"] = tool_result["recorded_by_operator"]
        correction = corrections.get(step.seq)
        if correction is not None:
            # The corrected value, labelled as an operator's: never passed off as the tool's.
            result.update(ok=True, output=correction.get("output"), error=None)
            result["corrected_by_operator"] = correction.get("actor")
            if correction.get("note"):
                result["operator_note"] = correction["note"]
        content = json.dumps(result, sort_keys=True, default=str)
        return Message(
            role="tool",
            content=content,
            tool_call_id=tool_result.get("call_id"),
            name=tool_result.get("name"),
        )
    if step.action == OperatorAction.CORRECT_RESULT:
        return Message(
            role="user",
            content=(
                f"[Operator correction] The result of tool call {step.call_id} "
                "was corrected by an operator; continue from the corrected result."
            ),
        )
    if step.action == OperatorAction.INSTRUCTION:
        # Marked as coming from an operator, never passed off as the model or a tool.
        return Message(role="user", content=f"[Operator instruction] {step_text(payload) or ''}")
    return None


class _OpenCalls:
    """Gives every tool call that never got a result (new input arrived first, e.g. after a
    rollback to a pending approval) an explicit "not run" result, right where the
    conversation moved on. Both provider APIs refuse a tool call left unanswered."""

    def __init__(self) -> None:
        self.open: dict[str, str] = {}

    def push(self, message: Message, out: list[Message]) -> None:
        if message.role == "tool":
            self.open.pop(message.tool_call_id or "", None)
        elif self.open:
            for call_id, name in self.open.items():
                content = json.dumps(
                    {
                        "name": name,
                        "ok": False,
                        "output": None,
                        "attempts": 0,
                        "error": "not run: the conversation moved on before this call ran",
                    },
                    sort_keys=True,
                )
                out.append(Message(role="tool", content=content, tool_call_id=call_id, name=name))
            self.open = {}
        if message.role == "assistant":
            self.open = {c.id: c.name for c in message.tool_calls}
        out.append(message)


class Conversation:
    """build_messages, kept up to date as a run appends steps: each step is rendered once,
    not once per model call (which made a long session quadratic in its length).

    `messages` is always equal to build_messages(system_prompt, history) over the steps
    given so far. A step that changes how earlier steps render (an operator's correction)
    rebuilds it; a run itself never appends one."""

    def __init__(self, system_prompt: str, history: list[StepRecord]) -> None:
        # The agent's instructions may change from call to call (a function of the
        # state): set before reading `messages`.
        self.system_prompt = system_prompt
        self._history = list(history)
        self._rebuild()

    def _rebuild(self) -> None:
        self._corrections = _corrections(self._history)
        self._open_calls = _OpenCalls()
        self._messages: list[Message] = []
        for step in self._history:
            self._render(step)

    def _render(self, step: StepRecord) -> None:
        message = _step_message(step, self._corrections)
        if message is not None:
            self._open_calls.push(message, self._messages)

    def add(self, step: StepRecord) -> None:
        self._history.append(step)
        if step.action == OperatorAction.CORRECT_RESULT:
            self._rebuild()
        else:
            self._render(step)

    @property
    def messages(self) -> list[Message]:
        system = [Message(role="system", content=self.system_prompt)] if self.system_prompt else []
        return system + self._messages
