"""PostgreSQL failover with nobody at the keyboard: a pg_auto_failover formation (Debian's
postgresql-NN-auto-failover: a monitor, a primary and its synchronous secondary; tests/servers.py
AutoFailoverCluster) whose primary's machine dies mid-run. The monitor promotes the
secondary; workers and a web process reach it through DATABASE_URL's multi-host form."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import urllib.error

import pytest
from django.db import connection

from config.database_url import parse_database_url
from sessions_app.models import ApiToken, SideEffect, Status, Step
from sessions_app.services.core import session_start

from ..conftest import ROOT, database_url, wait_final, wait_for
from ..servers import AutoFailoverCluster, ServerError, free_port
from .conftest import (
    assert_invariants,
    conversation,
    figures,
    first_step_after,
    reference,
    wait_for_tool_results,
)
from .test_database_faults import _get, without_attempts

pytestmark = [pytest.mark.fault, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def formation(django_db_setup, django_db_blocker):
    """The formation, with a copy of the test database on its primary (replicated to the
    secondary)."""
    try:
        cluster = AutoFailoverCluster()
    except ServerError as exc:  # pg_auto_failover or PostgreSQL's programs not installed
        pytest.skip(str(exc))
    try:
        with django_db_blocker.unblock():
            source = database_url()
        try:
            cluster.start()
        except ServerError as exc:
            # Three servers and their keepers starting at once on a loaded machine: one
            # more try, from nothing, before the test fails on it.
            print(f"\nthe formation did not start, starting a new one: {exc}")
            cluster.stop()
            cluster = AutoFailoverCluster().start()
        cluster.nodes["node1"].copy_database(source, "respawn_failover")
        for node in cluster.nodes.values():
            node.database = "respawn_failover"
    except BaseException:
        cluster.stop()
        raise
    yield cluster
    cluster.stop()


@pytest.fixture
def failover_db(formation, transactional_db):
    """This test process's connection through the formation's multi-host URL, as
    config.settings reads DATABASE_URL (the workers and the web server get the URL)."""
    entry = parse_database_url(formation.url())
    saved = {key: connection.settings_dict.get(key) for key in ("HOST", "PORT", "NAME")}
    saved_options = dict(connection.settings_dict.get("OPTIONS") or {})
    connection.close()
    connection.settings_dict.update(
        HOST=entry["HOST"],
        PORT=entry["PORT"],
        NAME=entry["NAME"],
        OPTIONS={**saved_options, **entry["OPTIONS"]},
    )
    try:
        yield formation
    finally:
        connection.close()
        connection.settings_dict.update(saved, OPTIONS=saved_options)


class Probe(threading.Thread):
    """GETs each URL in turn, without pause, until stopped; keeps (seconds, status)."""

    def __init__(self, urls: list[tuple[str, dict[str, str]]]) -> None:
        super().__init__(daemon=True)
        self.urls = urls
        self.answers: list[tuple[float, int]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for url, headers in self.urls:
                try:
                    status = _get(url, **headers)[0]
                except (urllib.error.URLError, OSError):
                    status = 0  # no answer at all: counted as a failure below
                self.answers.append((time.time(), status))
            time.sleep(0.05)


def test_primary_killed_mid_run_the_secondary_is_promoted_and_every_session_finishes(
    worker_env, fleet, failover_db, users, client, tmp_path
):
    url = failover_db.url()
    primary, secondary = failover_db.nodes["node1"], failover_db.nodes["node2"]
    assert failover_db.primary() == "node1"
    # Synchronous replication as pg_auto_failover sets it up (the secondary in the quorum):
    # a commit returns once the secondary has its WAL, so an acknowledged step survives.
    assert primary.sql("SHOW synchronous_standby_names") == [("ANY 1 (pgautofailover_standby_2)",)]
    assert primary.sql("SHOW synchronous_commit") == [("on",)]
    assert primary.sql("SELECT sync_state FROM pg_stat_replication") == [("quorum",)]

    ticks = 12
    sessions = [session_start(agent="slow", input=f"count to {ticks}") for _ in range(4)]
    _, token = ApiToken.issue(users["viewer"])
    client.force_login(users["viewer"])
    cookie = client.cookies["sessionid"].value
    for _ in range(2):
        fleet.start(DATABASE_URL=url)
    port = free_port()
    web_log = tmp_path / "web.log"
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env={**worker_env, "DATABASE_URL": url, "RESPAWN_DB_POOL": "1"},
        stdout=subprocess.DEVNULL,
        stderr=open(web_log, "wb"),  # noqa: SIM115 - the server's, closed with it
    )
    base = f"http://127.0.0.1:{port}"
    pages = [
        (f"{base}/api/sessions/{sessions[0].id}", {"Authorization": f"Bearer {token}"}),
        (f"{base}/sessions/{sessions[0].id}/", {"Cookie": f"sessionid={cookie}"}),
    ]
    probe = Probe(pages)

    def served() -> bool:
        try:
            return all(_get(page, **headers)[0] == 200 for page, headers in pages)
        except (urllib.error.URLError, OSError):  # not listening yet
            return False

    try:
        wait_for(served, timeout=30, interval=0.3, what="the web server")
        wait_for_tool_results(sessions, 4, timeout=60)
        probe.start()
        # Every step a worker has committed by now (a commit is visible only once the
        # secondary confirmed it): all of them must be there after the failover.
        acknowledged = set(Step.objects.filter(session__in=sessions).values_list("session", "seq"))
        killed = time.time()
        failover_db.kill_node("node1")  # pg_autoctl and PostgreSQL: the machine is gone
        connection.close()
        failover_db.wait_promoted("node2", timeout=90)
        promoted = time.time()
        wait_final(sessions, timeout=120)
        done = time.time()
        # The web process serves again once the secondary is promoted.
        wait_for(served, timeout=20, interval=0.3, what="the web server after the failover")
        probe.done.set()
        probe.join(timeout=40)
    except BaseException:
        print("--- web server log ---\n" + web_log.read_text(errors="replace")[-5000:])
        print("--- node2 (pg_autoctl) ---\n" + failover_db.log("node2")[-3000:])
        raise
    finally:
        probe.done.set()
        server.terminate()
        server.wait(timeout=10)

    assert secondary.sql("SELECT pg_is_in_recovery()") == [(False,)]
    present = set(Step.objects.filter(session__in=sessions).values_list("session", "seq"))
    lost = sorted(acknowledged - present)
    assert not lost, f"{len(lost)} acknowledged step(s) lost in the failover: {lost[:10]}"
    expected = without_attempts(reference("slow", f"count to {ticks}"))
    for session in sessions:
        session.refresh_from_db()
        assert session.status == Status.COMPLETED, (session.id, session.status, session.last_error)
        assert without_attempts(conversation(session)) == expected
        # One effect per tick, none twice; seqs contiguous, none twice (assert_invariants).
        assert SideEffect.objects.filter(session_id=session.id).count() == ticks
        assert_invariants(session)

    during = [status for moment, status in probe.answers if killed <= moment]
    assert during, "the web probe made no request during the failover"
    assert set(during) <= {200, 503}, (
        f"web requests during the failover answered {sorted(set(during))}, not only 200/503; "
        f"the web server's log:\n{web_log.read_text(errors='replace')[-6000:]}"
    )
    assert 503 in during, "no web request met the failover (the probe ran too late?)"
    first_step = first_step_after(sessions, killed)
    assert first_step is not None
    unavailable = [moment for moment, status in probe.answers if status == 503]
    figures(
        "pg_auto_failover, primary killed",
        promoted_s=promoted - killed,
        first_step_on_new_primary_s=first_step,
        all_done_after_kill_s=done - killed,
        web_503_window_s=max(unavailable) - min(unavailable),
        web_requests_during=len(during),
        web_503=during.count(503),
        acknowledged_steps=len(acknowledged),
        lost_steps=0,
    )
