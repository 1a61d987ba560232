"""A fake key in user input or a tool result never reaches PostgreSQL in the clear, a page or
a log; the run reads it back exactly."""

import logging

import pytest
from django.db import connection
from django.urls import reverse

from agent_runtime.agents import Agent, AgentRegistry
from agent_runtime.providers import ModelTurn, ToolCall
from agent_runtime.tools import ToolContext, tool
from sessions_app.models import AgentSession
from sessions_app.services.core import session_start

from ..conftest import run_inline

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


def test_secret_in_a_tool_result_and_user_input_is_sealed_and_read_back_exactly(
    client, users, caplog
):
    @tool
    def read_env(ctx: ToolContext) -> dict:
        """Reads the environment."""
        logging.getLogger("respawn.tools").warning("read_env saw %s", SECRET)
        return {"OPENAI_API_KEY": SECRET, "line": f"export KEY={SECRET}"}

    read = []

    class Model:
        def complete(self, messages, tools, settings):
            read.append(repr(messages))
            if messages[-1].role == "tool":
                return ModelTurn(text=f"Found {SECRET}")
            return ModelTurn(text=None, tool_calls=[ToolCall("c1", "read_env", {})])

    agents = AgentRegistry([Agent(name="envy", model="scripted:echo", tools=[read_env])])
    caplog.set_level(logging.INFO)
    session = session_start(agent="demo", input=f"use this key: {SECRET}", actor=users["operator"])
    AgentSession.objects.filter(id=session.id).update(agent="envy")
    run_inline(session, agents=agents, make_provider=lambda spec, options: (Model(), "m"))
    assert session.status == "completed"
    # The run read back what was written: the input and the tool's result exactly.
    assert f"use this key: {SECRET}" in read[0] and f"export KEY={SECRET}" in read[-1]
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

    redacting = {"redact", "redact_urls"}
    assert all(redacting & set(h.get("filters", [])) for h in settings.LOGGING["handlers"].values())
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


def test_request_lines_are_decoded_redacted_and_cannot_forge_lines():
    from sessions_app.logging import RedactingFilter

    record = logging.LogRecord(
        "gunicorn.access",
        logging.INFO,
        __file__,
        1,
        'GET /sessions/?q=postgres%3A%2F%2Fapp%3Ap%40ss%2Fw0rd%40db%2Fx%0A127.0.0.1 "GET /forged"',
        None,
        None,
    )
    RedactingFilter(decode_urls=True).filter(record)
    line = record.getMessage()
    assert "p@ss/w0rd" not in line and "[REDACTED:password]@db/x" in line
    assert "\n" not in line and "\\x0a127.0.0.1" in line


def test_a_logged_traceback_is_redacted(caplog):
    import io

    from sessions_app.logging import RedactingFilter

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter())
    logger = logging.getLogger("respawn.test-traceback")
    logger.addHandler(handler)
    try:
        try:
            raise RuntimeError(f"upstream refused {SECRET}")
        except RuntimeError:
            logger.exception("a call failed")
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    assert "RuntimeError: upstream refused [REDACTED:openai-key]" in text and SECRET not in text
