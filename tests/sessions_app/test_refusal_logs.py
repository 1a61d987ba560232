"""A refused request is one line in the log, not a traceback: nothing failed in the server."""

from __future__ import annotations

import io
import logging

import pytest
from django.urls import reverse

from sessions_app.services.core import session_start

pytestmark = pytest.mark.django_db


@pytest.fixture
def console():
    """What the console handler (settings.LOGGING: the root logger's) writes, as `make run`
    shows it."""
    handler = next(h for h in logging.getLogger().handlers if h.name == "console")
    stream = io.StringIO()
    previous = handler.setStream(stream)
    yield stream
    handler.setStream(previous)


def test_a_viewers_refused_post_is_one_line(client, users, console):
    session = session_start(agent="echo", input="hello")
    client.force_login(users["viewer"])
    url = reverse("sessions:action", args=[session.id, "cancel"])
    response = client.post(url, HTTP_HX_REQUEST="true")
    assert response.status_code == 403
    lines = console.getvalue().splitlines()
    assert len(lines) == 1, console.getvalue()
    assert "Forbidden (Permission denied): " + url in lines[0]
    assert lines[0].endswith("only operators can change sessions")
    assert "Traceback" not in console.getvalue()


def test_a_status_the_policy_refuses_is_one_line(client, users, console):
    session = session_start(agent="echo", input="hello")
    client.force_login(users["operator"])
    client.post(reverse("sessions:action", args=[session.id, "cancel"]), HTTP_HX_REQUEST="true")
    response = client.post(
        reverse("sessions:action", args=[session.id, "cancel"]), HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 409
    assert "Traceback" not in console.getvalue()
    assert [line for line in console.getvalue().splitlines() if "Conflict" in line]


def test_a_bad_request_is_one_line_and_a_server_error_keeps_its_traceback(
    client, users, console, monkeypatch
):
    client.force_login(users["operator"])
    response = client.get(reverse("sessions:list"), {"q": "a\x00b"})
    assert response.status_code == 400
    assert "Traceback" not in console.getvalue()
    assert len(console.getvalue().splitlines()) == 1, console.getvalue()

    # A 5xx is a bug: its traceback is what the log is for.
    from sessions_app.dashboard import views

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(views, "_list_context", broken)
    client.raise_request_exception = False
    assert client.get(reverse("sessions:list")).status_code == 500
    assert "Traceback" in console.getvalue()
    assert "RuntimeError: a bug" in console.getvalue()
