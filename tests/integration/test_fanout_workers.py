"""Fan-out with real workers: the branches of one turn run on several workers at once."""

from __future__ import annotations

import pytest

from sessions_app.models import Status, Step
from sessions_app.services.core import session_start

from ..conftest import wait_stopped
from .test_workers import assert_consistent

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_research_branches_run_in_parallel_on_several_workers(start_worker):
    env = {"RESPAWN_RESEARCH_DELAY": "0.5", "RESPAWN_RESEARCH_PARALLEL": "8"}
    for _ in range(4):
        start_worker(**env)
    session = session_start(agent="research", input="research durable execution in 8 sources")
    session = wait_stopped(session, timeout=60)
    assert session.status == Status.COMPLETED, session.last_error
    assert_consistent(session)
    results = list(Step.objects.filter(session=session, kind="tool_result").order_by("seq"))
    assert len(results) == 8
    # Parallel: branches ran at the same time on different workers (their run times
    # overlap), however slow the machine makes each one; one after the other, none would.
    running_together = max(
        sum(1 for other in results if other.started_at < r.finished_at <= other.finished_at)
        for r in results
    )
    assert running_together >= 2, [(r.started_at, r.finished_at) for r in results]
    assert Step.objects.filter(session=session, payload__event="joined").count() == 1
    assert Step.objects.filter(session=session, kind="model").count() == 2
