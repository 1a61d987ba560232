"""An offline model for the support agent (`scripted:support-desk`): deterministic, so
tests can hold its sessions to exact answers, and enough like a real model to show every
tool at work. A real deployment sets SUPPORT_AGENT_MODEL to a vendor's model instead."""

from __future__ import annotations

import re

from agent_runtime import Message, ModelTurn, scripted_model
from agent_runtime.providers.scripted import position, tool_call, tool_results

REFUND = re.compile(
    r"refund.*?order\s+(?P<order>[A-Z0-9-]+).*?(?P<amount>\d+(?:\.\d\d)?)", re.I | re.S
)


@scripted_model("support-desk")
def support_desk(messages: list[Message]) -> ModelTurn:
    request, after, turn, base = position(messages)
    results = tool_results(after)
    if match := REFUND.search(request):
        if turn == 0:
            cents = round(float(match["amount"]) * 100)
            return ModelTurn(
                text="A refund needs a person's approval; asking for it now.",
                tool_calls=[
                    tool_call(
                        base,
                        0,
                        "issue_refund",
                        order_id=match["order"].upper(),
                        amount_cents=cents,
                        reason=request[:200],
                    )
                ],
            )
        result = results[-1]
        if result.get("ok"):
            out = result["output"]
            return ModelTurn(
                text=f"Refund {out['refund']} issued: {out['amount_cents'] / 100:.2f} for order "
                f"{out['order_id']}. It arrives in 5 to 10 business days."
            )
        return ModelTurn(text=f"The refund was not issued: {result.get('error')}")
    if re.search(r"\bticket\b|\bperson\b|\bhuman\b", request, re.I):
        if turn == 0:
            urgent = bool(re.search(r"urgent|asap|down", request, re.I))
            return ModelTurn(
                text="Opening a ticket.",
                tool_calls=[
                    tool_call(
                        base,
                        0,
                        "open_ticket",
                        subject=request[:80].strip(),
                        body=request,
                        priority="urgent" if urgent else "normal",
                    )
                ],
            )
        result = results[-1]
        if not result.get("ok"):
            return ModelTurn(text=f"I could not open a ticket: {result.get('error')}")
        return ModelTurn(
            text=f"I opened ticket #{result['output']['ticket']} "
            f"({result['output']['priority']}); a person will answer by email."
        )
    if turn == 0:
        return ModelTurn(
            text="Searching the documentation.",
            tool_calls=[tool_call(base, 0, "search_docs", query=request)],
        )
    found = results[0].get("output", {}).get("results") if results else []
    if not found:
        return ModelTurn(
            text="The documentation does not cover that. Ask me to open a ticket and a person "
            "will help."
        )
    if turn == 1:
        return ModelTurn(
            text=f"Reading {found[0]['title']}.",
            tool_calls=[tool_call(base, 0, "read_doc", doc_id=found[0]["id"])],
        )
    doc = results[-1].get("output") or {}
    paragraph = (doc.get("text") or "").split("\n\n")[1].replace("\n", " ").strip()
    return ModelTurn(text=f"{paragraph} (from: {doc.get('title')})")
