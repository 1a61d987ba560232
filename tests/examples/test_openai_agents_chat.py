"""The README's OpenAI Agents SDK example (examples/openai_agents_chat.py), run as a
program against a local Chat Completions stub: a conversation over two calls, a refund
that waits for approval, approved, and finished by a worker's run of the same agent."""

from __future__ import annotations

import pytest

from sessions_app.models import AgentSession, Status
from sessions_app.openai_agents.session import session_id_for
from sessions_app.services.core import session_approve

from ..conftest import ROOT, program_env, run_inline, run_python

pytestmark = pytest.mark.django_db(transaction=True)


def chat(sdk_model, *args: str) -> str:
    env = program_env(OPENAI_BASE_URL=sdk_model.url + "/v1", OPENAI_API_KEY="stub-key")
    return run_python(str(ROOT / "examples" / "openai_agents_chat.py"), *args, env=env)


def test_the_example_keeps_a_conversation_and_waits_for_approval(
    sdk_model, settings, users, monkeypatch
):
    assert chat(sdk_model, "ticket-42", "hello") == "You said: hello (turn 1, saw 2 messages)\n"
    out = chat(sdk_model, "ticket-42", "refund O-7 1250")
    assert "waiting for approval: refund {'order': 'O-7', 'amount': 1250}" in out
    session = AgentSession.objects.get(id=session_id_for("ticket-42"))
    assert session.agent == "support-sdk" and session.status == Status.WAITING_INPUT
    assert str(session.id) in out

    # A worker with the example's agents finishes the approved run.
    monkeypatch.setenv("OPENAI_BASE_URL", sdk_model.url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "stub-key")
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    settings.RESPAWN_AGENTS = ["openai_agents_chat:agents"]
    session_approve(session_id=session.id, actor=users["operator"])
    session = run_inline(session)
    assert session.status == Status.COMPLETED, session.last_error
    assert session.final_answer == "Refund result: refunded 1250 on O-7"
