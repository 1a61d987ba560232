"""Leases are on the database's clock: a worker whose own clock runs minutes fast takes no
live lease, and one whose clock runs minutes slow keeps no dead worker's session waiting
(the claim, the heartbeat and the reconciler compare the database's time)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from sessions_app.models import AgentSession
from sessions_app.services.core import session_start
from sessions_app.services.dispatch import next_lease_expiry, reconcile
from sessions_app.store import session_store

pytestmark = pytest.mark.django_db(transaction=True)


def _clock_off_by(monkeypatch, offset: timedelta) -> None:
    """This process's wall clock runs `offset` off (a worker on a badly synced host)."""
    real = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real() + offset)


def _expire_on_the_database_clock(session_id) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {AgentSession._meta.db_table}"
            " SET lease_expires_at = clock_timestamp() - interval '1 second' WHERE id = %s",
            [session_id],
        )


def test_a_worker_whose_clock_runs_fast_takes_no_live_lease(monkeypatch, rq_queue):
    session = session_start(agent="echo", input="hi")
    store = session_store()
    first = store.claim(str(session.id), "worker-a", ttl=30)
    assert first is not None
    _clock_off_by(monkeypatch, timedelta(minutes=10))
    assert store.claim(str(session.id), "worker-b", ttl=30) is None
    assert store.heartbeat(first, ttl=30).alive
    assert 0 < next_lease_expiry() <= 30
    rq_queue.empty()  # even with its job gone, a live lease is left alone
    assert reconcile() == []


def test_a_worker_whose_clock_runs_slow_takes_over_an_expired_lease(monkeypatch):
    session = session_start(agent="echo", input="hi")
    store = session_store()
    assert store.claim(str(session.id), "worker-a", ttl=30) is not None
    _expire_on_the_database_clock(session.id)  # worker-a died; its lease ran out
    _clock_off_by(monkeypatch, timedelta(minutes=-10))
    taken = store.claim(str(session.id), "worker-b", ttl=30)
    assert taken is not None and taken.crashes == 1
    row = AgentSession.objects.get(id=session.id)
    # The new lease runs from the database's now, not from 10 minutes ago.
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        db_now = cursor.fetchone()[0]
    assert timedelta(seconds=25) < row.lease_expires_at - db_now <= timedelta(seconds=30)


def _what_people_see(client, call, users, session) -> dict[str, bool]:
    """Whether each face a person reads shows `session` as stuck."""
    client.force_login(users["operator"])
    page = client.get(reverse("sessions:detail", args=[session.id]))
    attention = client.get(reverse("sessions:attention"))
    api = call("get", f"/api/sessions/{session.id}", role="viewer").json()
    client.force_login(User.objects.create_superuser("sue", password="pw"))
    admin = client.get(
        reverse("admin:sessions_app_agentsession_changelist"), {"stuck": "yes"}
    ).context["cl"]
    return {
        "page": ">Stuck<" in page.content.decode(),
        "attention": session.id in {s.id for s in attention.context["stuck"]},
        "api": api["stuck"],
        "admin": session.id in {s.id for s in admin.result_list},
    }


def test_a_web_process_whose_clock_runs_fast_shows_a_live_lease_live(
    monkeypatch, client, call, users
):
    session = session_start(agent="echo", input="hi")
    assert session_store().claim(str(session.id), "worker-a", ttl=30) is not None
    _clock_off_by(monkeypatch, timedelta(minutes=10))
    assert _what_people_see(client, call, users, session) == dict.fromkeys(
        ("page", "attention", "api", "admin"), False
    )


def test_a_web_process_whose_clock_runs_slow_shows_an_expired_lease_stuck(
    monkeypatch, client, call, users
):
    session = session_start(agent="echo", input="hi")
    assert session_store().claim(str(session.id), "worker-a", ttl=30) is not None
    _expire_on_the_database_clock(session.id)  # worker-a died; its lease ran out
    _clock_off_by(monkeypatch, timedelta(minutes=-10))
    assert _what_people_see(client, call, users, session) == dict.fromkeys(
        ("page", "attention", "api", "admin"), True
    )
