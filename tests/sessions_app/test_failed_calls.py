"""Failures that must not hide: a session that completes with failed tool calls says so
(its status, the API, "needs attention"), an infrastructure failure is told apart from
the tool's own error in the trace, a late call of a fenced-off run is listed, and a
database outage met by a request is a quick 503, not a 500."""

from __future__ import annotations

import pytest
from django.db import OperationalError
from django.urls import reverse

from agent_runtime.agents import Agent, AgentRegistry
from agent_runtime.loop import RunConfig
from agent_runtime.providers import ModelTurn, ToolCall
from agent_runtime.store import Lease
from agent_runtime.tools import ToolContext, TransientRetry, tool
from sessions_app.models import AgentSession, ApiToken, AuditEvent, Status
from sessions_app.services.core import session_reject, session_start
from sessions_app.store import session_store

from ..conftest import run_inline

pytestmark = pytest.mark.django_db


@tool(name="tick")
def unreachable(ctx: ToolContext, n: int) -> dict:
    """Count a tick in a database that is down."""
    raise ConnectionRefusedError(111, "Connection refused")


class TickOnce:
    def complete(self, messages, tools, settings):
        if messages[-1].role == "tool":
            return ModelTurn(text="done, whatever the tool said")
        return ModelTurn(text=None, tool_calls=[ToolCall("c1", "tick", {"n": 1})])


def run_with_unreachable_tick(session: AgentSession) -> AgentSession:
    return run_inline(
        session,
        agents=AgentRegistry([Agent(name="slow", model="scripted:slow", tools=[unreachable])]),
        config=RunConfig(
            worker_id="t", transient=TransientRetry(retry_for=0.2, backoff=0.02, backoff_max=0.05)
        ),
        make_provider=lambda spec, options: (TickOnce(), "m"),
    )


def test_a_session_that_completes_with_an_infrastructure_failure_says_so(client, users):
    session = run_with_unreachable_tick(session_start(agent="slow", input="count to 1"))
    assert session.status == Status.COMPLETED and session.failed_calls == 1
    client.force_login(users["viewer"])
    page = client.get(reverse("sessions:detail", args=[session.id])).content.decode()
    assert "Completed with 1 failed tool call" in page
    assert "infrastructure failure" in page  # the result's badge: not the tool's own error
    attention = client.get(reverse("sessions:attention")).content.decode()
    section = attention.split('id="sec-failed_calls"')[1].split("</section>")[0]
    assert str(session.id) in section
    _, token = ApiToken.issue(users["viewer"])
    body = client.get(f"/api/sessions/{session.id}", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert body["failed_calls"] == 1


def test_a_rejected_call_is_a_persons_decision_not_a_failure():
    session = run_inline(session_start(agent="approval", input="pay invoice 42 of 1200 cents"))
    assert session.status == Status.WAITING_INPUT
    session_reject(session_id=session.id, reason="not this one")
    session = run_inline(session)
    assert session.status == Status.COMPLETED
    assert session.failed_calls == 0


def test_a_late_call_of_a_fenced_off_run_is_listed_under_needs_attention(client, users):
    session = run_inline(session_start(agent="echo", input="hi"))
    session_store().report_late_call(
        Lease(str(session.id), "host:1:abc", 3),
        {"worker": "host:1:abc", "tool": "send_notification", "effect": "refused"},
    )
    event = AuditEvent.objects.get(session=session, action="late_tool_call")
    assert event.actor_label == "worker host:1:abc" and event.after["effect"] == "refused"
    client.force_login(users["viewer"])
    attention = client.get(reverse("sessions:attention")).content.decode()
    section = attention.split('id="sec-late_calls"')[1].split("</section>")[0]
    assert str(session.id) in section


def _down(*args, **kwargs):
    raise OperationalError("connection failed: FATAL:  the database system is shutting down")


def test_a_database_outage_is_a_503_json_under_the_api(client, users, monkeypatch):
    session = session_start(agent="echo", input="hi")
    _, token = ApiToken.issue(users["viewer"])
    monkeypatch.setattr("sessions_app.api.routes._get", _down)
    response = client.get(f"/api/sessions/{session.id}", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 503
    assert response.json()["error"] == "unavailable"
    assert int(response["Retry-After"]) > 0


def test_a_database_outage_is_a_503_page_in_the_dashboard(client, users, monkeypatch):
    session = session_start(agent="echo", input="hi")
    client.force_login(users["viewer"])
    monkeypatch.setattr("sessions_app.dashboard.views._get_session", _down)
    response = client.get(reverse("sessions:detail", args=[session.id]))
    assert response.status_code == 503
    assert "The database is unavailable" in response.content.decode()
    assert "Retry-After" in response


@pytest.mark.django_db(transaction=True)
def test_a_lock_or_a_timeout_on_a_database_that_is_up_is_said_as_such(client, users, settings):
    """The 503 says what happened: a statement that ran out of time or waited out its lock
    on a database that is up is not "the database is unavailable"."""
    import psycopg
    from django.db import connection

    from ..conftest import database_url

    session = session_start(agent="echo", input="hi")
    _, token = ApiToken.issue(users["viewer"])
    client.force_login(users["viewer"])
    api = f"/api/sessions/{session.id}"
    page = reverse("sessions:detail", args=[session.id])
    table = AgentSession._meta.db_table
    for limit, said in [
        ("lock_timeout", "what this request needs is locked by another transaction"),
        ("statement_timeout", "a statement of this request ran past its time limit"),
    ]:
        with psycopg.connect(database_url()) as other:
            other.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")  # until the end
            with connection.cursor() as cursor:
                cursor.execute(f"SET {limit} = '200ms'")
            try:
                response = client.get(api, HTTP_AUTHORIZATION=f"Bearer {token}")
                html = client.get(page).content.decode()
            finally:
                with connection.cursor() as cursor:
                    cursor.execute(f"RESET {limit}")
            other.rollback()
        assert response.status_code == 503 and int(response["Retry-After"]) > 0
        assert response.json() == {
            "error": "unavailable",
            "detail": f"the database is up but {said}; nothing was changed, try again shortly",
        }
        assert said in html and "The database is unavailable" not in html


@pytest.mark.django_db(transaction=True)
def test_a_request_waits_for_a_held_lock_at_most_the_lock_wait(client, users, settings):
    """A table lock another transaction holds (a migration, a maintenance command) delays a
    page or an API request RESPAWN_LOCK_WAIT, then it answers 503 saying so: the web thread
    is not held for as long as the lock is. The connection goes back without the bound."""
    import threading
    import time

    import psycopg
    from django.db import connection

    from ..conftest import database_url

    settings.RESPAWN_LOCK_WAIT = 0.5
    session = session_start(agent="echo", input="hi")
    _, token = ApiToken.issue(users["viewer"])
    client.force_login(users["viewer"])
    with psycopg.connect(database_url()) as other:
        other.execute(f"LOCK TABLE {AgentSession._meta.db_table} IN ACCESS EXCLUSIVE MODE")
        # Let go after 8 s whatever happens: a request that waits for it answers 200 then.
        release = threading.Timer(8, other.rollback)
        release.start()
        try:
            times, answers = [], []
            for path, headers in [
                (f"/api/sessions/{session.id}", {"HTTP_AUTHORIZATION": f"Bearer {token}"}),
                (reverse("sessions:detail", args=[session.id]), {}),
            ]:
                started = time.monotonic()
                answers.append(client.get(path, **headers))
                times.append(time.monotonic() - started)
        finally:
            release.cancel()
            other.rollback()
    assert [a.status_code for a in answers] == [503, 503], times
    assert max(times) < 4, times
    assert "locked by another transaction" in answers[0].json()["detail"]
    assert "locked by another transaction" in answers[1].content.decode()
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone()[0] == "0"
    again = client.get(f"/api/sessions/{session.id}", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert again.status_code == 200


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("face", ["api", "page"])
def test_a_connection_broken_before_the_first_query_is_a_503_and_is_replaced(client, users, face):
    """A connection the database dropped (a primary that failed over, a restart) breaks on
    a request's first query, the one the lock bound is set on: a 503 as for any outage,
    never a 500, and the broken connection is not used again (the next request is served)."""
    import psycopg
    from django.db import close_old_connections, connection

    from ..conftest import database_url

    session = session_start(agent="echo", input="hi")
    _, token = ApiToken.issue(users["viewer"])
    client.force_login(users["viewer"])
    client.raise_request_exception = False
    if face == "api":
        path, headers = f"/api/sessions/{session.id}", {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    else:
        path, headers = reverse("sessions:detail", args=[session.id]), {}
    assert client.get(path, **headers).status_code == 200
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    with psycopg.connect(database_url(), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    response = client.get(path, **headers)
    assert response.status_code == 503, response.content[:300]
    assert int(response["Retry-After"]) > 0
    # The end of a request in a server closes a connection an error made unusable (the
    # test client leaves that out): the next request has a fresh one.
    close_old_connections()
    assert connection.connection is None
    assert client.get(path, **headers).status_code == 200


def test_any_other_error_is_still_a_500(client, users, monkeypatch):
    session = session_start(agent="echo", input="hi")
    client.raise_request_exception = False
    client.force_login(users["viewer"])

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr("sessions_app.dashboard.views._get_session", broken)
    assert client.get(reverse("sessions:detail", args=[session.id])).status_code == 500


def test_a_server_error_is_a_styled_page_that_needs_no_database(rf, django_assert_num_queries):
    from sessions_app.dashboard.views import server_error

    with django_assert_num_queries(0):
        response = server_error(rf.get("/sessions/"))
    body = response.content.decode()
    assert response.status_code == 500
    assert "Something went wrong on the server" in body and "respawn.css" in body
    assert "<title>Server error · Respawn</title>" in body


def test_a_driver_error_met_outside_django_is_a_503_too(rf):
    """A statement made on psycopg's connection directly raises psycopg's own error, not
    Django's: met by the error handler, it is an outage all the same, not a 500."""
    import psycopg

    from sessions_app.dashboard.views import server_error

    try:
        raise psycopg.OperationalError("consuming input failed: server closed the connection")
    except psycopg.OperationalError:
        response = server_error(rf.get("/sessions/"))
    assert response.status_code == 503
    assert "The database is unavailable" in response.content.decode()
