"""Servers that go away and come back: Redis down for seconds under idle workers, PgBouncer
SIGKILLed and started again under a web process and a worker, PostgreSQL stopped and
started under a web process. After each, every request is answered and every session runs,
with nobody doing anything."""

from __future__ import annotations

import concurrent.futures
import time

import pytest
from django.db import connection

from sessions_app.models import ApiToken
from sessions_app.services.core import session_start

from ..conftest import wait_final
from ..servers import PgBouncer
from .conftest import (
    assert_completed,
    figures,
    http_get,
    reference,
    runs_of,
    wait_for_tool_results,
    web_server,
)

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


def test_pgbouncer_killed_and_started_again_every_request_after_is_answered(
    worker_env, fleet, users, client, tmp_path
):
    """PgBouncer (transaction mode) in front of the test database, a pooled web process
    and a worker behind it; PgBouncer SIGKILLed mid-run and started again on its port:
    every request after it is back answers 200 (each of the web process's pooled
    connections broke), and the session finishes with no step lost or doubled."""
    db = connection.settings_dict
    bouncer = PgBouncer(db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432), pool_size=4)
    bouncer.start()
    url = bouncer.url(db["NAME"])
    behind = {"DATABASE_URL": url, "RESPAWN_POOLER_SAFE": "1"}
    session = session_start(agent="slow", input="count to 8")
    _, token = ApiToken.issue(users["viewer"])
    client.force_login(users["viewer"])
    cookie = client.cookies["sessionid"].value
    fleet.start(RESPAWN_SLOW_DELAY="0.3", **behind)
    try:
        with web_server({**worker_env, **behind}, tmp_path / "web.log") as base:
            api, page = f"{base}/api/sessions/{session.id}", f"{base}/sessions/{session.id}/"
            auth = {"Authorization": f"Bearer {token}"}
            logged_in = {"Cookie": f"sessionid={cookie}"}

            def both(_=None) -> list[int]:
                return [http_get(api, **auth)[0], http_get(page, **logged_in)[0]]

            def many() -> set[int]:
                # 8 at a time: the pool holds several connections, each one used.
                with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
                    return {code for pair in pool.map(both, range(16)) for code in pair}

            assert many() == {200}
            wait_for_tool_results([session], 2)
            bouncer.kill()
            down = time.monotonic()
            time.sleep(1)
            bouncer.start()
            back = time.monotonic()
            first = both()
            first_took = time.monotonic() - back
            assert first == [200, 200]
            assert many() == {200}
            wait_final([session], timeout=40)
    finally:
        bouncer.stop()
    assert_completed(session, reference("slow", "count to 8"))
    figures(
        "pgbouncer killed, started again 1 s later",
        down_s=back - down,
        first_requests_after_s=first_took,
        requests_after=34,
        non_200_after=0,
        runs=runs_of(session),
    )


def test_the_first_requests_after_postgres_is_back_are_answered(
    worker_env, private_db, users, client, tmp_path
):
    """A pooled web process (8 connections in its pool), PostgreSQL stopped (a request in
    the outage answers 503 and sets the pool reconnecting with pauses) and started again:
    the requests made right after it accepts connections all answer 200, at once (the
    pool's pause between two broken connections and between two reconnection attempts
    held them off until they answered 503)."""
    session = session_start(agent="echo", input="hi")
    _, token = ApiToken.issue(users["viewer"])
    client.force_login(users["viewer"])
    cookie = client.cookies["sessionid"].value
    env = {**worker_env, "DATABASE_URL": private_db.url()}
    with web_server(env, tmp_path / "web.log") as base:
        api, page = f"{base}/api/sessions/{session.id}", f"{base}/sessions/{session.id}/"
        auth = {"Authorization": f"Bearer {token}"}
        logged_in = {"Cookie": f"sessionid={cookie}"}

        def both(_=None) -> list[tuple[int, float]]:
            return [http_get(api, **auth)[::3], http_get(page, **logged_in)[::3]]

        def many() -> list[tuple[int, float]]:
            with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
                return [answer for pair in pool.map(both, range(8)) for answer in pair]

        assert {status for status, _ in many()} == {200}
        private_db.stop(mode="fast", remove=False)
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as outage:
            # A request in the outage: the pool tries to reconnect, pausing between tries.
            during = outage.submit(http_get, api, **auth)
            time.sleep(1.2)
            private_db.start()
            assert private_db.is_ready()
            answers = both()  # one after the other: the pool's broken connections in turn
            answers += many()
        connection.close()
        assert during.result()[0] in (200, 503)
    assert {status for status, _ in answers} == {200}, answers
    assert answers[0][1] < 1.0, answers  # the first pause alone was 1 s
    slowest = max(took for _, took in answers)
    figures(
        "web process, postgres stopped and started",
        requests_after=len(answers),
        first_s=answers[0][1],
        slowest_s=slowest,
    )
