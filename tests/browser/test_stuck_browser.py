"""A queued session waiting behind a busy worker is waiting its turn, not stuck: no red
badge and nothing under "needs attention". Once no worker runs anything (the worker was
killed), the same session is flagged, with the run the dead worker left behind."""

from __future__ import annotations

import time

import pytest

from sessions_app.models import AgentSession, Status
from sessions_app.services.core import session_start

from ..conftest import wait_for
from .conftest import console_errors, login, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def badge(page, session) -> int:
    return page.locator(f"tr#row-{session.id} .badge.stuck").count()


def test_queued_behind_a_busy_worker_is_not_stuck_until_no_worker_runs(
    page, users, start_worker, settings
):
    worker = start_worker(RESPAWN_SLOW_DELAY="0.5")
    busy = session_start(agent="slow", input="count to 60", title="the long one")
    wait_for(
        lambda: AgentSession.objects.get(id=busy.id).lease_is_live(),
        timeout=30,
        what="the worker to take the long one",
    )
    waiting = session_start(agent="echo", input="after the long one", title="waiting its turn")
    # Its dispatch is older than the grace period while the only worker is busy.
    time.sleep(settings.RESPAWN_DISPATCH_GRACE + 1.5)
    waiting.refresh_from_db()
    assert waiting.status == Status.QUEUED
    assert AgentSession.objects.get(id=busy.id).lease_is_live()

    login(page, "olivia", "pw-operator")
    assert page.locator(f"tr#row-{waiting.id} .status").inner_text() == "Queued"
    assert badge(page, waiting) == 0
    page.wait_for_timeout(2500)  # a refresh of the live row, too
    assert badge(page, waiting) == 0
    assert not AgentSession.objects.filter(AgentSession.stuck_q()).exists()
    page.goto("/sessions/attention/")
    assert page.locator(f"a[href='/sessions/{waiting.id}/']").count() == 0
    screenshot(page, "queued-behind-busy-worker")

    # No worker runs anything any more: both need a person (or a worker) now.
    worker.kill()
    wait_for(
        lambda: not AgentSession.objects.get(id=busy.id).lease_is_live(),
        timeout=15,
        what="the dead worker's lease to expire",
    )
    page.goto("/sessions/")
    assert badge(page, waiting) == 1 and badge(page, busy) == 1
    assert {s.id for s in AgentSession.objects.filter(AgentSession.stuck_q())} == {
        busy.id,
        waiting.id,
    }
    page.goto("/sessions/attention/")
    assert page.locator(f"a[href='/sessions/{waiting.id}/']").count() >= 1
    assert console_errors(page) == []
