"""A support agent for Respawn: answers from the documents shipped in docs/, opens tickets,
and issues refunds that a person approves.

    RESPAWN_AGENTS=support_agent:agents python manage.py rqworker

The model is `SUPPORT_AGENT_MODEL`: any model Respawn's providers speak, e.g.
`openai:gpt-4o-mini` (with OPENAI_API_KEY, or OPENAI_BASE_URL for a local server) or
`anthropic:claude-sonnet-4-5` (with ANTHROPIC_API_KEY). The default,
`scripted:support-desk`, is an offline model for trying it out and for tests
(support_agent/offline.py).
"""

from __future__ import annotations

import os
from typing import Annotated, Literal

from pydantic import Field

from agent_runtime import Agent, AgentState, Limits, SessionState, ToolContext, ToolError, tool

from . import desk, offline  # noqa: F401 - offline registers the scripted model

INSTRUCTIONS = """You are the support agent of an online shop.
Answer from the documentation: search it, read the best match, and quote what it says.
Open a ticket when the documentation does not answer the question or the customer asks
for a person. Refunds: only within the refund policy, and say that a person approves each
one. Keep answers short."""


@tool
def search_docs(query: str) -> dict:
    """Search the support documentation; returns the best matching documents."""
    found = desk.search(query)
    return {"results": [{"id": doc.id, "title": doc.title, "score": s} for doc, s in found]}


@tool
def read_doc(doc_id: str) -> dict:
    """Read one document of the support documentation by its id."""
    for doc in desk.documents():
        if doc.id == doc_id:
            return {"id": doc.id, "title": doc.title, "text": doc.text}
    known = ", ".join(d.id for d in desk.documents())
    raise ToolError(f"no document {doc_id!r} (documents: {known})")


@tool
def open_ticket(
    ctx: ToolContext,
    subject: Annotated[str, Field(min_length=3, max_length=120)],
    body: str,
    priority: Literal["low", "normal", "urgent"] = "normal",
) -> dict:
    """Open a support ticket for a person to pick up; returns its number."""
    number = desk.open_ticket(
        ctx.idempotency_key, session=ctx.session_id, subject=subject, body=body, priority=priority
    )
    if number not in ctx.state["tickets"]:
        ctx.state["tickets"].append(number)
    return {"ticket": number, "priority": priority}


@tool
def ticket_status(ticket_id: int) -> dict:
    """The status of a support ticket."""
    found = desk.ticket(ticket_id)
    if found is None:
        raise ToolError(f"no ticket #{ticket_id}")
    return found


@tool(needs_approval=True)
def issue_refund(
    ctx: ToolContext,
    order_id: Annotated[str, Field(pattern=r"^[A-Z0-9-]{3,20}$")],
    amount_cents: Annotated[int, Field(gt=0, le=500_000)],
    reason: str,
) -> dict:
    """Refund (part of) an order. A person approves every refund before it is issued."""
    refund_id = desk.refund(
        ctx.idempotency_key, order_id=order_id, amount_cents=amount_cents, reason=reason
    )
    ctx.state["refunded_cents"] = ctx.state.get("refunded_cents", 0) + amount_cents
    return {"refund": refund_id, "order_id": order_id, "amount_cents": amount_cents}


def instructions(state: SessionState) -> str:
    """The instructions, plus what this conversation already did (its own state)."""
    tickets = state.agent_data.get("tickets") or []
    if not tickets:
        return INSTRUCTIONS
    numbers = ", ".join(f"#{n}" for n in tickets)
    return f"{INSTRUCTIONS}\nTickets already opened in this conversation: {numbers}."


support = Agent(
    name="support",
    version="1",
    description="Answers from the shop's documentation, opens tickets, refunds with approval.",
    model=os.environ.get("SUPPORT_AGENT_MODEL", "scripted:support-desk"),
    instructions=instructions,
    tools=[search_docs, read_doc, open_ticket, ticket_status, issue_refund],
    limits=Limits(max_steps=60, max_tokens=200_000),
    state=AgentState(version=1, initial=lambda: {"tickets": []}),
)


def agents() -> list[Agent]:
    return [support]
