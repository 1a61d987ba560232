"""Servers that go away and come back: Redis down for seconds under idle workers, PgBouncer
SIGKILLed and started again under a web process and a worker, PostgreSQL stopped and
started under a web process. After each, every request is answered and every session runs,
with nobody doing anything."""

from __future__ import annotations

import time

import pytest

from sessions_app.services.core import session_start

from ..conftest import wait_final
from .conftest import assert_completed, figures, reference, wait_for_tool_results

pytestmark = [pytest.mark.fault, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def logged_tracebacks(log: str) -> int:
    """Log records with a traceback (a chained exception's own tracebacks not counted)."""
    lines = log.splitlines()
    return sum(
        1
        for before, line in zip(lines, lines[1:], strict=False)
        if line.startswith("Traceback (most recent call last)") and before[:2] == "20"
    )


def test_a_redis_outage_restarts_no_worker_and_floods_no_log(fleet, private_redis):
    """Redis down 9 s while a worker runs a session (its job ends in the outage): the worker
    process waits for Redis (a line now and then, at most one traceback), is restarted once
    at most, and takes the job of a session started after Redis is back by itself."""
    worker = fleet.start(RESPAWN_SLOW_DELAY="0.5")
    first = session_start(agent="slow", input="count to 6")
    wait_for_tool_results([first], 1)
    before = worker.pids()[1:]
    private_redis.stop()
    time.sleep(9)
    private_redis.start()
    back = time.monotonic()
    after = session_start(agent="echo", input="after")
    wait_final([first, after], timeout=30)
    took = time.monotonic() - back
    assert_completed(first, reference("slow", "count to 6"))
    assert_completed(after)
    log = worker.log()
    restarts = log.count("starting a new one")
    tracebacks = logged_tracebacks(log)
    assert restarts <= 1, log
    assert tracebacks <= 1, log
    # A line when the wait starts and when it ends, not one per retry or reconciler pass.
    complaints = [
        line
        for line in log.splitlines()
        if "Redis" in line and (" ERROR " in line or " WARNING " in line)
    ]
    assert len(complaints) <= 8, complaints
    figures(
        "redis down 9 s",
        worker_restarts=restarts,
        tracebacks=tracebacks,
        lines_about_redis=len(complaints),
        same_worker_process=int(worker.pids()[1:] == before),
        session_after_done_s=took,
    )
