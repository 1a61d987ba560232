"""A deterministic, offline model for the demo agents and the tests.

Each script reads the conversation (as any model would) and decides the next turn from it
alone, so a resumed session gets exactly the turn an uninterrupted one would have got.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from ..tools import ToolSpec
from .base import Message, ModelSettings, ModelTurn, ProviderError, ToolCall, Usage

Script = Callable[[list[Message]], ModelTurn]


def _episode(messages: list[Message]) -> tuple[str, list[Message]]:
    """The latest user request and everything the model saw after it."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == "user":
            return messages[index].content or "", messages[index + 1 :]
    return "", []


def _results(after: list[Message]) -> list[dict[str, Any]]:
    results = []
    for message in after:
        if message.role == "tool":
            try:
                results.append(json.loads(message.content or "{}"))
            except json.JSONDecodeError:
                results.append({"ok": False, "error": message.content})
    return results


def _turn_number(after: list[Message]) -> int:
    return sum(1 for m in after if m.role == "assistant")


def _call(turn: int, index: int, name: str, **arguments: Any) -> ToolCall:
    return ToolCall(id=f"call_{turn}_{index}", name=name, arguments=arguments)


def _calls(messages: list[Message]) -> int:
    """Model turns so far in the whole conversation: call ids stay unique across episodes."""
    return sum(1 for m in messages if m.role == "assistant")


EXPRESSION = re.compile(r"what\s+is\s+(?P<expr>[-+*/().\d\s]+?)\s*(?:[,?;]|then\b|$)", re.I)


def demo(messages: list[Message]) -> ModelTurn:
    task, after = _episode(messages)
    base = _calls(messages) - _turn_number(after)
    turn = _turn_number(after)
    results = _results(after)
    match = EXPRESSION.search(task)
    wants_note = bool(re.search(r"\bnote\b|\bsave\b", task, re.I))
    if match is None:
        return ModelTurn(
            text=(
                "I can work out arithmetic and save the result as a note. "
                "Try: what is (12*7)+3, then save it as a note."
            )
        )
    expression = match.group("expr").strip()
    plan = (
        [f"compute {expression}"]
        + (["save the result as a note"] if wants_note else [])
        + ["answer"]
    )
    if turn == 0:
        return ModelTurn(
            text=f"Plan: {'; '.join(plan)}.",
            tool_calls=[
                _call(base + turn, 0, "update_plan", items=plan, done=0),
                _call(base + turn, 1, "calculator", expression=expression),
            ],
        )
    calc = next((r for r in results if r.get("name") == "calculator"), None)
    if calc is None or not calc.get("ok"):
        error = (calc or {}).get("error") or "no result"
        return ModelTurn(text=f"I could not compute {expression}: {error}")
    value = calc["output"]["value"]
    if wants_note and turn == 1:
        return ModelTurn(
            text=f"{expression} = {value}. Saving it as a note.",
            tool_calls=[
                _call(base + turn, 0, "update_plan", items=plan, done=1),
                _call(base + turn, 1, "save_note", text=f"{expression} = {value}"),
            ],
        )
    note = next((r for r in results if r.get("name") == "save_note"), None)
    if note is not None and note.get("ok"):
        return ModelTurn(text=f"{expression} = {value}. Saved as note {note['output']['note']}.")
    if note is not None:
        return ModelTurn(
            text=f"{expression} = {value}, but saving the note failed: {note['error']}"
        )
    return ModelTurn(text=f"{expression} = {value}.")


def slow(messages: list[Message]) -> ModelTurn:
    task, after = _episode(messages)
    base = _calls(messages) - _turn_number(after)
    match = re.search(r"count\s+to\s+(\d+)", task, re.I)
    target = min(int(match.group(1)), 10_000) if match else 3
    turn = _turn_number(after)
    if turn < target:
        return ModelTurn(
            text=f"Tick {turn + 1} of {target}.",
            tool_calls=[_call(base + turn, 0, "tick", n=turn + 1)],
        )
    return ModelTurn(text=f"Counted to {target}.")


def flaky(messages: list[Message]) -> ModelTurn:
    _, after = _episode(messages)
    base = _calls(messages) - _turn_number(after)
    turn = _turn_number(after)
    if turn == 0:
        return ModelTurn(
            text="Fetching the status page.",
            tool_calls=[_call(base + turn, 0, "flaky_fetch", resource="status")],
        )
    result = _results(after)[-1]
    if result.get("ok"):
        return ModelTurn(
            text=f"Status: {result['output']['body']} (after {result['attempts']} attempts)."
        )
    return ModelTurn(text=f"The status page could not be fetched: {result.get('error')}")


def approval(messages: list[Message]) -> ModelTurn:
    task, after = _episode(messages)
    base = _calls(messages) - _turn_number(after)
    turn = _turn_number(after)
    if turn == 0:
        return ModelTurn(
            text="This needs a payment; asking for approval.",
            tool_calls=[
                _call(
                    base + turn,
                    0,
                    "send_payment",
                    recipient="ACME Ltd",
                    amount_cents=4200,
                    memo=task,
                )
            ],
        )
    result = _results(after)[-1]
    if result.get("ok"):
        return ModelTurn(text=f"Payment sent: reference {result['output']['reference']}.")
    return ModelTurn(text=f"Payment not sent: {result.get('error')}")


def notify(messages: list[Message]) -> ModelTurn:
    """Sends one notification (a side effect that is not idempotent), then reports."""
    task, after = _episode(messages)
    base = _calls(messages) - _turn_number(after)
    turn = _turn_number(after)
    if turn == 0:
        return ModelTurn(
            text="Sending the notification.",
            tool_calls=[_call(base, 0, "send_notification", to="ops@example.com", text=task)],
        )
    result = _results(after)[-1]
    if result.get("ok"):
        return ModelTurn(text=f"Notification sent: {result['output']['message_id']}.")
    return ModelTurn(text=f"Notification not sent: {result.get('error')}")


def poison(messages: list[Message]) -> ModelTurn:
    """Calls a tool that takes its worker process down, every time."""
    _, after = _episode(messages)
    base = _calls(messages) - _turn_number(after)
    if _turn_number(after) == 0:
        return ModelTurn(text="Running the bad tool.", tool_calls=[_call(base, 0, "crash_worker")])
    return ModelTurn(text="The bad tool returned (it should not have).")


MIGRATE = re.compile(
    r"migrate\s+(?P<total>[\d,_]+)\s+records?(?:\s+in\s+batches\s+of\s+(?P<size>[\d,_]+))?",
    re.I,
)


def _number(text: str | None, default: int) -> int:
    digits = re.sub(r"[,_]", "", text or "")
    return int(digits) if digits else default


def migrate(messages: list[Message]) -> ModelTurn:
    """One batch per turn, each starting at the cursor the previous batch returned."""
    task, after = _episode(messages)
    base = _calls(messages) - _turn_number(after)
    turn = _turn_number(after)
    match = MIGRATE.search(task)
    if match is None:
        return ModelTurn(
            text="Tell me how many records to migrate: 'migrate 1000 records in batches of 100'."
        )
    total = min(_number(match.group("total"), 0), 1_000_000)
    size = max(1, min(_number(match.group("size"), 100), 10_000))
    results = [r for r in _results(after) if r.get("name") == "migrate_batch"]
    cursor = 0
    if results:
        last = results[-1]
        if not last.get("ok"):
            return ModelTurn(text=f"The migration stopped: {last.get('error')}")
        cursor = int(last["output"]["end"])
    if cursor >= total:
        return ModelTurn(text=f"Migrated {total} records in {len(results)} batches of {size}.")
    return ModelTurn(
        text=f"Batch {turn + 1}: records {cursor + 1} to {min(cursor + size, total)} of {total}.",
        tool_calls=[_call(base + turn, 0, "migrate_batch", cursor=cursor, size=size, total=total)],
    )


RESEARCH = re.compile(r"research\s+(?P<topic>.+?)\s+in\s+(?P<n>\d+)\s+sources?", re.I)


def research(messages: list[Message]) -> ModelTurn:
    """All lookups in one turn (the runtime may fan them out), then a summary."""
    from .. import corpus

    task, after = _episode(messages)
    base = _calls(messages) - _turn_number(after)
    match = RESEARCH.search(task)
    if match is None:
        return ModelTurn(text="Ask me to 'research <topic> in <N> sources'.")
    topic = match.group("topic").strip()
    sources = corpus.pick(topic, max(1, min(int(match.group("n")), len(corpus.sources()))))
    if _turn_number(after) == 0:
        return ModelTurn(
            text=f"Looking {topic} up in {len(sources)} sources at once.",
            tool_calls=[
                _call(base, index, "lookup", source=source, query=topic)
                for index, source in enumerate(sources)
            ],
        )
    results = [r for r in _results(after) if r.get("name") == "lookup"]
    # By source, not by arrival: branches finish in any order, the summary does not.
    found = sorted(
        (r["output"] for r in results if r.get("ok") and r["output"]["lines"]),
        key=lambda output: output["source"],
    )
    failed = [r for r in results if not r.get("ok")]
    lines = [f"- {f['source']}: {f['lines'][0]}" for f in found]
    summary = (
        f"{topic}: {sum(len(f['lines']) for f in found)} matching lines in {len(found)} of "
        f"{len(results)} sources."
    )
    if failed:
        summary += f" {len(failed)} lookup(s) failed: " + "; ".join(
            str(r.get("error")) for r in failed
        )
    return ModelTurn(text="\n".join([summary, *lines]))


def echo(messages: list[Message]) -> ModelTurn:
    task, _ = _episode(messages)
    return ModelTurn(text=f"You said: {task}")


SCRIPTS: dict[str, Script] = {
    "demo": demo,
    "slow": slow,
    "flaky": flaky,
    "approval": approval,
    "echo": echo,
    "notify": notify,
    "poison": poison,
    "migrate": migrate,
    "research": research,
}


def _estimate_tokens(text: str | None) -> int:
    return (len(text or "") + 3) // 4


class ScriptedProvider:
    def __init__(self, *, model: str, options: dict[str, Any]) -> None:
        if model not in SCRIPTS:
            known = ", ".join(sorted(SCRIPTS))
            raise ProviderError(f"no scripted model {model!r} (known: {known})", permanent=True)
        self.script = SCRIPTS[model]

    def complete(
        self, messages: list[Message], tools: list[ToolSpec], settings: ModelSettings
    ) -> ModelTurn:
        turn = self.script(messages)
        offered = {t.name for t in tools}
        for call in turn.tool_calls:
            if call.name not in offered:
                raise ProviderError(f"script called unknown tool {call.name!r}", permanent=True)
        tokens_in = sum(_estimate_tokens(m.content) for m in messages)
        tokens_out = _estimate_tokens(turn.text) + 8 * len(turn.tool_calls)
        return ModelTurn(
            text=turn.text,
            tool_calls=turn.tool_calls,
            usage=Usage(input_tokens=tokens_in, output_tokens=tokens_out),
        )
