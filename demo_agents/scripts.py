"""The demo agents' scripted models: deterministic and offline, registered as
`scripted:<agent>` when this module is imported."""

from __future__ import annotations

import re

from agent_runtime import Message, ModelTurn, scripted_model
from agent_runtime.providers.scripted import episode as _episode
from agent_runtime.providers.scripted import position as _position
from agent_runtime.providers.scripted import tool_call as _call
from agent_runtime.providers.scripted import tool_results as _results

EXPRESSION = re.compile(r"what\s+is\s+(?P<expr>[-+*/().\d\s]+?)\s*(?:[,?;]|then\b|$)", re.I)


INSTRUCTION = "[Operator instruction] "
CORRECTION = "[Operator correction]"


def _operator_edit(messages: list[Message]) -> ModelTurn | None:
    """An answer that shows an operator's edit took effect: a correction is answered from
    the corrected result, an instruction is followed (and said to be)."""
    task, _ = _episode(messages)
    if not task.startswith((INSTRUCTION, CORRECTION)):
        return None
    requests = [m.content or "" for m in messages if m.role == "user"]
    original = next(
        (r for r in reversed(requests) if not r.startswith((INSTRUCTION, CORRECTION))), ""
    )
    match = EXPRESSION.search(original)
    expression = match.group("expr").strip() if match else "the result"
    if task.startswith(CORRECTION):
        corrected = [
            r for r in _results(messages) if r.get("corrected_by_operator") and r.get("ok")
        ]
        if not corrected:
            return ModelTurn(text="An operator corrected a result; I have nothing to redo.")
        fix = corrected[-1]
        output = fix.get("output")
        value = output.get("value", output) if isinstance(output, dict) else output
        note = f" ({fix['operator_note']})" if fix.get("operator_note") else ""
        return ModelTurn(
            text=f"With the corrected result from {fix['corrected_by_operator']}{note}: "
            f"{expression} = {value}."
        )
    instruction = task[len(INSTRUCTION) :].strip()
    if re.search(r"\bbrief\b|\bshort\b|\bconcise\b", instruction, re.I):
        last = next(
            (m.content for m in reversed(messages) if m.role == "assistant" and m.content), ""
        )
        return ModelTurn(text=f"(brief, as instructed) {last.split('. ')[0].rstrip('.')}.")
    return ModelTurn(text=f"Following the operator's instruction: {instruction}")


@scripted_model("demo")
def demo(messages: list[Message]) -> ModelTurn:
    edited = _operator_edit(messages)
    if edited is not None:
        return edited
    task, after, turn, base = _position(messages)
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


@scripted_model("slow")
def slow(messages: list[Message]) -> ModelTurn:
    task, after, turn, base = _position(messages)
    match = re.search(r"count\s+to\s+(\d+)", task, re.I)
    target = min(int(match.group(1)), 10_000) if match else 3
    if turn < target:
        return ModelTurn(
            text=f"Tick {turn + 1} of {target}.",
            tool_calls=[_call(base + turn, 0, "tick", n=turn + 1)],
        )
    return ModelTurn(text=f"Counted to {target}.")


@scripted_model("flaky")
def flaky(messages: list[Message]) -> ModelTurn:
    _, after, turn, base = _position(messages)
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


@scripted_model("approval")
def approval(messages: list[Message]) -> ModelTurn:
    task, after, turn, base = _position(messages)
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


@scripted_model("notify")
def notify(messages: list[Message]) -> ModelTurn:
    """Sends one notification (a side effect that is not idempotent), then reports."""
    task, after, turn, base = _position(messages)
    if turn == 0:
        return ModelTurn(
            text="Sending the notification.",
            tool_calls=[_call(base, 0, "send_notification", to="ops@example.com", text=task)],
        )
    result = _results(after)[-1]
    if result.get("ok"):
        return ModelTurn(text=f"Notification sent: {result['output']['message_id']}.")
    return ModelTurn(text=f"Notification not sent: {result.get('error')}")


@scripted_model("poison")
def poison(messages: list[Message]) -> ModelTurn:
    """Calls a tool that takes its worker process down, every time."""
    _, after, turn, base = _position(messages)
    if turn == 0:
        return ModelTurn(text="Running the bad tool.", tool_calls=[_call(base, 0, "crash_worker")])
    return ModelTurn(text="The bad tool returned (it should not have).")


MIGRATE = re.compile(
    r"migrate\s+(?P<total>[\d,_]+)\s+records?(?:\s+in\s+batches\s+of\s+(?P<size>[\d,_]+))?",
    re.I,
)


def _number(text: str | None, default: int) -> int:
    digits = re.sub(r"[,_]", "", text or "")
    return int(digits) if digits else default


@scripted_model("migrate")
def migrate(messages: list[Message]) -> ModelTurn:
    """One batch per turn, each starting at the cursor the previous batch returned."""
    task, after, turn, base = _position(messages)
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


@scripted_model("research")
def research(messages: list[Message]) -> ModelTurn:
    """All lookups in one turn (the runtime may fan them out), then a summary."""
    from . import corpus

    task, after, turn, base = _position(messages)
    match = RESEARCH.search(task)
    if match is None:
        return ModelTurn(text="Ask me to 'research <topic> in <N> sources'.")
    topic = match.group("topic").strip()
    sources = corpus.pick(topic, max(1, min(int(match.group("n")), len(corpus.sources()))))
    if turn == 0:
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


@scripted_model("echo")
def echo(messages: list[Message]) -> ModelTurn:
    edited = _operator_edit(messages)
    if edited is not None:
        return edited
    task, _ = _episode(messages)
    return ModelTurn(text=f"You said: {task}")
