"""A fake key in user input or a tool result never reaches PostgreSQL, a page or a log."""

import logging

import pytest
from django.db import connection
from django.urls import reverse

from agent_runtime.agents import Agent, AgentRegistry
from agent_runtime.loop import run_session
from agent_runtime.providers import ModelTurn, ToolCall
from agent_runtime.tools import ToolContext, tool
from sessions_app.models import AgentSession
from sessions_app.runtime import run_config
from sessions_app.services import session_start
from sessions_app.store import DjangoEffects, DjangoSessionStore

pytestmark = pytest.mark.django_db

SECRET = "sk-proj-FAKEfakeFAKEfake0123456789abcdefgh"


def database_text() -> str:
    with connection.cursor() as cursor:
        parts = []
        for table in (
            "sessions_app_agentsession",
            "sessions_app_step",
            "sessions_app_checkpoint",
            "sessions_app_auditevent",
        ):
            cursor.execute(f"SELECT row_to_json(t)::text FROM {table} t")
            parts += [row[0] for row in cursor.fetchall()]
    return "\n".join(parts)


def test_secret_in_a_tool_result_and_user_input_is_stored_redacted(client, users, caplog):
    @tool
    def read_env(ctx: ToolContext) -> dict:
        """Reads the environment."""
        logging.getLogger("respawn.tools").warning("read_env saw %s", SECRET)
        return {"OPENAI_API_KEY": SECRET, "line": f"export KEY={SECRET}"}

    class Model:
        def complete(self, messages, tools, settings):
            if messages[-1].role == "tool":
                return ModelTurn(text=f"Found {SECRET}")
            return ModelTurn(text=None, tool_calls=[ToolCall("c1", "read_env", {})])

    agents = AgentRegistry([Agent(name="envy", model="scripted:echo", tools=[read_env])])
    caplog.set_level(logging.INFO)
    session = session_start(agent="demo", input=f"use this key: {SECRET}", actor=users["operator"])
    AgentSession.objects.filter(id=session.id).update(agent="envy")
    run_session(
        str(session.id),
        store=DjangoSessionStore(),
        agents=agents,
        effects=DjangoEffects(),
        config=run_config(),
        make_provider=lambda spec, options: (Model(), "m"),
    )
    session.refresh_from_db()
    assert session.status == "completed"
    stored = database_text()
    assert SECRET not in stored
    assert "[REDACTED:openai-key]" in stored and "[REDACTED:api_key]" not in stored
    client.force_login(users["operator"])
    page = client.get(reverse("sessions:detail", args=[session.id])).content.decode()
    assert SECRET not in page and "[REDACTED:" in page
    api = client.get(reverse("sessions:list")).content.decode()
    assert SECRET not in api


def test_log_lines_are_redacted_by_the_configured_handlers(settings):
    import io

    from sessions_app.logging import RedactingFilter

    assert all("redact" in h.get("filters", []) for h in settings.LOGGING["handlers"].values())
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter())
    logger = logging.getLogger("respawn.test-redaction")
    logger.addHandler(handler)
    try:
        logger.warning(
            "calling the provider with key %s and %s", SECRET, "postgres://u:pw12345@db/x"
        )
    finally:
        logger.removeHandler(handler)
    line = stream.getvalue()
    assert SECRET not in line and "pw12345" not in line
    assert "[REDACTED:openai-key]" in line and "[REDACTED:password]" in line
