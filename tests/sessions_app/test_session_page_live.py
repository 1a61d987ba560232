"""The session page: its one live poll (the header says when new steps arrived, and the
whole-session parts follow it, throttled on a very long session), and its forms."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from sessions_app.dashboard import page as session_page
from sessions_app.models import AgentSession, Status
from sessions_app.services.core import session_start

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}


def header(client, session: AgentSession, seen: int):
    url = reverse("sessions:panel", args=[session.id]) + f"?part=header&seen={seen}"
    return client.get(url, **HX)


def test_the_header_poll_says_when_new_steps_arrived(client, users):
    session = session_start(agent="echo", input="hi")
    AgentSession.objects.filter(id=session.id).update(status=Status.RUNNING, last_seq=5)
    client.force_login(users["viewer"])
    moved = header(client, session, seen=3)
    assert moved.status_code == 200
    assert json.loads(moved.headers["HX-Trigger"])["session-moved"] == {"last_seq": 5}
    assert "seen=5" in moved.content.decode()  # the next poll compares with what it drew
    still = header(client, session, seen=5)
    assert "HX-Trigger" not in still.headers


def test_whole_session_parts_of_a_long_live_session_follow_the_poll_at_most_every_10s(
    client, users, monkeypatch
):
    session = session_start(agent="echo", input="hi")
    AgentSession.objects.filter(id=session.id).update(status=Status.RUNNING)
    client.force_login(users["viewer"])
    timeline = reverse("sessions:timeline", args=[session.id])
    detail = reverse("sessions:detail", args=[session.id])
    assert 'hx-trigger="session-moved from:body"' in client.get(timeline, **HX).content.decode()
    monkeypatch.setattr(session_page, "LIVE_HEAVY_STEPS", 0)
    throttled = 'hx-trigger="session-moved from:body throttle:10s"'
    assert throttled in client.get(timeline, **HX).content.decode()
    assert "session-moved from:body throttle:10s" in client.get(detail).content.decode()


def test_the_correction_form_is_not_filled_with_an_output_too_long_to_edit_there(client, users):
    from sessions_app.models import Kind, Step

    session = session_start(agent="echo", input="hi")
    Step.objects.create(
        session=session,
        seq=2,
        kind=Kind.TOOL_RESULT,
        payload={"call_id": "c1", "name": "big", "status": "ok", "output": "x" * 9000},
    )
    Step.objects.create(
        session=session,
        seq=3,
        kind=Kind.TOOL_RESULT,
        payload={"call_id": "c2", "name": "small", "status": "ok", "output": {"n": 1}},
    )
    AgentSession.objects.filter(id=session.id).update(status=Status.PAUSED, last_seq=3)
    client.force_login(users["operator"])
    page = client.get(reverse("sessions:detail", args=[session.id])).content.decode()
    assert '<option value="3" data-prefill="{\n  &quot;n&quot;: 1\n}">' in page
    assert '<option value="2" data-prefill="">' in page
    assert "x" * 9000 not in page.split('name="result_seq"')[1].split("</form>")[0]
