"""Faults of PostgreSQL itself, on a server of the tests' own (the shared one is never
touched): its connection slots exhausted, restarts under running and idle workers, and an
outage met by a pooled web process."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import psycopg
import pytest
from django.db import connection
from rq.registry import FailedJobRegistry

from sessions_app.models import ApiToken, SideEffect, Status, Step
from sessions_app.services.core import session_start
from sessions_app.services.dispatch import queue

from ..conftest import ROOT, wait_final, wait_for
from ..servers import free_port
from .conftest import (
    assert_completed,
    assert_invariants,
    conversation,
    figures,
    first_step_after,
    reference,
    runs_of,
    wait_for_tool_results,
)

pytestmark = [pytest.mark.fault, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def without_attempts(trace):
    """A trace with its tool results' attempt counts and retried errors left out: what a
    run that met a fault must still equal the uninterrupted run in."""
    return [
        (kind, {k: v for k, v in payload.items() if k not in ("attempts", "attempt_errors")})
        for kind, payload in trace
    ]


def infrastructure_retries(sessions) -> list[str]:
    """The retried infrastructure errors the tool results of these sessions recorded."""
    out = []
    for errors in Step.objects.filter(
        session__in=sessions, kind="tool_result", payload__has_key="attempt_errors"
    ).values_list("payload__attempt_errors", flat=True):
        out += [e for e in errors if e.startswith("infrastructure error: ")]
    return out


def test_connection_slots_exhausted_tool_calls_are_retried_and_nothing_is_lost(fleet, private_db):
    """Every connection slot taken for 10 s while tools open connections of their own:
    their calls fail with "too many clients", are retried as transient, and every session
    completes with every effect."""
    ticks = 16
    sessions = [session_start(agent="slow", input=f"count to {ticks}") for _ in range(3)]
    for _ in range(2):
        fleet.start(DATABASE_URL=private_db.url(), RESPAWN_SLOW_DELAY="0.25")
    wait_for_tool_results(sessions, 3, timeout=30)
    hogs: list[psycopg.Connection] = []
    try:
        while True:
            try:
                hogs.append(psycopg.connect(private_db.url(), connect_timeout=5))
            except psycopg.OperationalError as exc:
                assert "too many clients" in str(exc), exc
                break
            assert len(hogs) < 100, "the server never ran out of connection slots"
        exhausted = time.time()
        time.sleep(10)
    finally:
        for hog in hogs:
            hog.close()
    released = time.time()
    wait_final(sessions, timeout=60)
    done = time.time()
    expected = reference("slow", f"count to {ticks}")
    for session in sessions:
        session.refresh_from_db()
        assert session.status == Status.COMPLETED, (session.id, session.status, session.last_error)
        assert session.failed_calls == 0
        # Every result ok, as in the uninterrupted run (some after more attempts).
        assert without_attempts(conversation(session)) == without_attempts(expected)
        assert SideEffect.objects.filter(session_id=session.id).count() == ticks
        assert_invariants(session)
    retried = infrastructure_retries(sessions)
    assert retried, "no tool call met the exhausted server"
    assert all("too many clients" in e or "connection" in e for e in retried), retried
    met = Step.objects.filter(
        session__in=sessions, kind="tool_result", payload__attempt_errors__isnull=False
    ).count()
    figures(
        "connection slots exhausted 10 s",
        calls_retried=met,
        retries=len(retried),
        failed_calls=0,
        slots_taken=len(hogs),
        first_step_after_release_s=first_step_after(sessions, released) or -1.0,
        all_done_after_release_s=done - released,
        exhausted_s=released - exhausted,
    )


def test_postgres_restarts_running_sessions_finish_and_first_jobs_after_succeed(fleet, private_db):
    sessions = [session_start(agent="slow", input="count to 8") for _ in range(3)]
    workers = [fleet.start(DATABASE_URL=private_db.url()) for _ in range(2)]
    wait_for_tool_results(sessions, 2, timeout=30)
    down = time.time()
    private_db.restart()  # under running sessions: every connection breaks mid-run
    back = time.time()
    connection.close()  # this test's own, too
    wait_final(sessions, timeout=60)
    resumed = [first_step_after([s], back) for s in sessions]
    expected = reference("slow", "count to 8")
    for session in sessions:
        assert_completed(session, expected)

    # Idle workers, each holding a connection the next restart breaks.
    wait_for(lambda: not fleet.busy(), timeout=20, what="the workers to be idle")
    failed = FailedJobRegistry(queue=queue())  # on the private Redis
    failed_before = set(failed.get_job_ids())
    private_db.restart()
    connection.close()
    started = time.monotonic()
    later = [session_start(agent="echo", input=f"hello {n}") for n in range(6)]
    wait_final(later, timeout=30)
    elapsed = time.monotonic() - started
    for session in later:
        first_job = session.job_id
        session.refresh_from_db()
        assert session.status == Status.COMPLETED, (session.id, session.status, session.last_error)
        assert runs_of(session) == 1
        # Run by the job it was dispatched with: not one the reconciler sent after a failure.
        assert session.job_id == first_job
    assert set(failed.get_job_ids()) == failed_before, "a job failed after the restart"
    for worker in workers:
        assert worker.process.poll() is None
    # Well under a lease TTL plus a reconciler pass: nothing waited for a retry.
    assert elapsed < 15, elapsed
    figures(
        "postgres restarted",
        restart_s=back - down,
        running_sessions_next_step_after_back_s_max=max(r for r in resumed if r is not None),
        idle_restart_six_new_sessions_done_s=elapsed,
        failed_jobs_after_idle_restart=0,
    )


def _get(url: str, **headers: str) -> tuple[int, dict[str, str], bytes, float]:
    started = time.monotonic()
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read(), 0.0
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read(), time.monotonic() - started


def test_the_web_pool_serves_the_first_request_after_a_long_outage(private_db, settings):
    """The web process's pool, configured as settings configure it: after an outage far
    longer than a request's wait, its pauses between connection attempts never outlast
    that wait, so the first request once the database is back gets a connection."""
    import psycopg_pool

    options = settings.RESPAWN_DB_POOL_OPTIONS
    pool = psycopg_pool.ConnectionPool(
        private_db.url(), check=psycopg_pool.ConnectionPool.check_connection, **options
    )
    wait = options["timeout"]

    def query() -> float:
        began = time.monotonic()
        with pool.connection() as conn:
            conn.execute("SELECT 1")
        return time.monotonic() - began

    try:
        pool.wait(timeout=10)
        query()
        private_db.stop(mode="fast", remove=False)
        outage = time.monotonic()
        for _ in range(2):  # requests in the outage wait their bound and fail
            with pytest.raises(psycopg_pool.PoolTimeout):
                query()
        # Left to itself the pool's next attempt would be 8 s after the one at 7 s.
        time.sleep(max(0.0, 10 - (time.monotonic() - outage)))
        private_db.start()
        took = query()
        assert took < wait, took
    finally:
        pool.close()
        if not private_db.is_ready():
            private_db.start()
    figures("web pool, postgres down 10 s", first_request_after_outage_s=took)


def test_web_process_answers_503_in_an_outage_and_recovers_on_the_first_request_after(
    worker_env, fleet, private_db, users, client, tmp_path
):
    session = session_start(agent="echo", input="hi")
    _, token = ApiToken.issue(users["viewer"])
    client.force_login(users["viewer"])
    cookie = client.cookies["sessionid"].value
    worker = fleet.start(DATABASE_URL=private_db.url())
    port = free_port()
    env = {
        **worker_env,
        "DATABASE_URL": private_db.url(),
        "RESPAWN_DB_POOL": "1",
        "DJANGO_SETTINGS_MODULE": "config.settings_test",
    }
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "web.log", "wb"),  # noqa: SIM115 - the server's, closed with it
    )
    base = f"http://127.0.0.1:{port}"
    api = f"{base}/api/sessions/{session.id}"
    page = f"{base}/sessions/{session.id}/"
    auth = {"Authorization": f"Bearer {token}"}
    logged_in = {"Cookie": f"sessionid={cookie}"}

    def both() -> list[int]:
        return [_get(api, **auth)[0], _get(page, **logged_in)[0]]

    def up() -> bool:
        try:
            return both() == [200, 200]
        except urllib.error.URLError:  # not listening yet
            return False

    try:
        wait_for(up, timeout=30, interval=0.3, what="the web server")
        wait_final([session], timeout=30)
        # Every pooled connection is broken by the restart: the first requests after it
        # are served, none is a 500.
        private_db.restart()
        connection.close()
        first = time.monotonic()
        assert both() == [200, 200]
        first_after_restart = time.monotonic() - first
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            codes = list(pool.map(lambda _: both(), range(16)))
        assert {c for pair in codes for c in pair} == {200}

        private_db.stop(mode="fast", remove=False)
        outage = time.monotonic()
        status, headers, body, took = _get(api, **auth)
        api_503 = took
        assert status == 503 and took < 6, (status, took)
        assert headers["Content-Type"] == "application/json"
        assert json.loads(body)["error"] == "unavailable"
        assert int(headers["Retry-After"]) > 0
        status, headers, body, took = _get(page, **logged_in)
        page_503 = took
        assert status == 503 and took < 6, (status, took)
        assert headers["Content-Type"].startswith("text/html")
        assert b"The database is unavailable" in body and b"respawn.css" in body
        assert "Retry-After" in headers
        time.sleep(max(0.0, 6 - (time.monotonic() - outage)))  # reconciler passes fail

        private_db.start()
        connection.close()
        first = time.monotonic()
        assert both() == [200, 200]
        first_after_outage = time.monotonic() - first
        wait_for(
            lambda: "reconciler works again" in worker.log(),
            timeout=20,
            what="the reconciler to recover",
        )
    except BaseException:
        print("--- web server log ---\n" + (tmp_path / "web.log").read_text(errors="replace"))
        raise
    finally:
        server.terminate()
        server.wait(timeout=10)
    # Two outages (the restart, the stop) of a dozen failed passes (one every 0.5 s): each
    # distinct error of an outage logged once, with its traceback ("terminating
    # connection", "shutting down", "connection refused", "starting up", in whatever order
    # the passes meet them), not once a pass.
    outages: list[list[str]] = [[]]
    for line in worker.log().splitlines():
        if "reconciler failed:" in line:
            outages[-1].append(line.split("reconciler failed:", 1)[1])
        elif "reconciler works again" in line:
            outages.append([])
    failures = [error for outage in outages for error in outage]
    assert failures, "the reconciler's passes failed while the database was down"
    for outage in outages:
        assert len(outage) == len(set(outage)), outage
    assert sum("Connection refused" in error for error in failures) <= 2, failures
    figures(
        "web process, postgres restarted then down",
        first_requests_after_restart_s=first_after_restart,
        requests_after_restart=34,
        non_200_after_restart=0,
        api_503_s=api_503,
        page_503_s=page_503,
        first_requests_after_outage_s=first_after_outage,
        reconciler_errors_logged=len(failures),
    )
