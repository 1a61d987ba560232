"""What the integration tests of agents from other frameworks check alike."""

from __future__ import annotations

import time

from sessions_app.models import Status, Step
from sessions_app.services.core import session_cancel

from ..stubs.sdk_model import sdk_model  # noqa: F401


def cancel_and_assert_nothing_lands(session, actor) -> None:
    """Cancel a session while a worker runs it: it reads cancelled at once, and the
    worker's next write is refused."""
    session_cancel(session_id=session.id, actor=actor)
    session.refresh_from_db()
    assert session.status == Status.CANCELLED
    written = Step.objects.filter(session=session).count()
    time.sleep(2)  # the worker's next write is refused: nothing lands after the cancel
    assert Step.objects.filter(session=session).count() == written


def assert_resumed_from_a_checkpoint(session) -> None:
    """Two runs: the second (after a worker died) started from a stored checkpoint."""
    runs = Step.objects.filter(session=session, payload__event="run_started").order_by("seq")
    assert runs.count() == 2 and runs[1].payload["checkpoint_seq"] > 0
