"""A bulk action on every session the list's filters match: who may, what a bad filter
gets, and a report that counts what each batch did and why sessions were refused."""

from __future__ import annotations

import json
import re
from urllib.parse import unquote

import pytest
from django.urls import reverse

from sessions_app.dashboard import views
from sessions_app.models import AgentSession, AuditEvent, Status
from sessions_app.services.core import session_start

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}


def post(client, **form):
    return client.post(reverse("sessions:bulk"), {"scope": "matching", **form}, **HX)


def test_a_viewer_may_not_and_a_bad_filter_is_named(client, users):
    session_start(agent="echo", input="x")
    client.force_login(users["viewer"])
    assert post(client, action="cancel", **{"f.agent": "echo"}).status_code == 403
    client.force_login(users["operator"])
    response = post(client, action="cancel", **{"f.status": "exploded"})
    assert response.status_code == 400
    assert unquote(response["X-Respawn-Error"]) == "unknown status 'exploded'"
    response = post(client, action="cancel", **{"f.agent": "nobody-runs-this"})
    assert response.status_code == 400
    response = post(client, action="cancel", **{"f.agent": "echo", "f.q": "no such words"})
    assert response.status_code == 400  # nothing matches: nothing to confirm
    response = post(client, action="cancel", confirm="yes", after="nope", **{"f.agent": "echo"})
    assert response.status_code == 400
    assert AgentSession.objects.get().status == Status.QUEUED


def test_batches_carry_the_tally_and_count_refusals_by_reason(client, users, monkeypatch):
    monkeypatch.setattr(views, "BULK_BATCH", 3)
    queued = [session_start(agent="echo", input=f"q{i}") for i in range(5)]
    done = session_start(agent="echo", input="already done")
    AgentSession.objects.filter(id=done.id).update(status=Status.COMPLETED)
    client.force_login(users["operator"])

    preview = post(client, action="cancel", **{"f.agent": "echo"})
    assert preview.status_code == 200
    assert "This will cancel <b>all 6</b> sessions matching these filters (agent echo)" in (
        preview.content.decode()
    )
    assert not AuditEvent.objects.filter(action="cancel").exists()  # asked first

    form = {"action": "cancel", "confirm": "yes", "total": "6", "f.agent": "echo"}
    batches = 0
    while True:
        response = post(client, **form)
        assert response.status_code == 200
        batches += 1
        page = response.content.decode()
        # What the next batch's form carries (the page posts it by itself).
        carried = dict(
            re.findall(
                r'<input type="hidden" name="(after|done|refused|reasons)" value="([^"]*)"', page
            )
        )
        if "after" not in carried:
            break
        form.update({k: v.replace("&quot;", '"') for k, v in carried.items()})
        json.loads(form["reasons"])
    assert batches == 2
    assert "Cancel: 5 done, 1 refused of 6 matching." in page
    assert "1 refused: session is already completed" in page
    assert {s.status for s in AgentSession.objects.filter(id__in=[s.id for s in queued])} == {
        Status.CANCELLED
    }
    assert AuditEvent.objects.filter(action="cancel").count() == 5
