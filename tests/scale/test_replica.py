"""Read replicas (DATABASE_REPLICA_URL) against a real streaming replica: a PostgreSQL primary
of the test's own (initdb) and a replica of it (pg_basebackup), a real web process in front
of both, and a replica that lags (replay paused with pg_wal_replay_pause())."""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from sessions_app.models import AgentSession
from tests.servers import PostgresServer, free_port

from ..conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
SESSIONS = AgentSession._meta.db_table
MAX_LAG = 15  # RESPAWN_REPLICA_MAX_LAG of the web process (generous: a loaded machine)

pytestmark = pytest.mark.integration

SETUP_USER = """
from django.contrib.auth.models import Group, User
from sessions_app.models import ApiToken
user = User.objects.create_user("olivia", password="pw-operator")
user.groups.add(Group.objects.get_or_create(name="operator")[0])
print(ApiToken.issue(user)[1])
"""


class Web:
    """A client of the web process: a cookie jar (a browser) and, apart, an API token."""

    def __init__(self, base: str, token: str) -> None:
        self.base = base
        self.token = token
        self.jar = http.cookiejar.CookieJar()
        self.browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def page(self, path: str, data: dict | None = None) -> tuple[str, str]:
        """A dashboard page (GET, or POST of a form with its CSRF token): body and where
        its reads came from."""
        body = urllib.parse.urlencode(data).encode() if data is not None else None
        with self.browser.open(self.base + path, data=body, timeout=20) as response:
            return response.read().decode(), response.headers["X-Respawn-Reads"]

    def api(self, path: str, payload: dict | None = None) -> tuple[dict, str]:
        """An API call with the token and no cookies (a program, not a browser)."""
        request = urllib.request.Request(
            self.base + path,
            data=json.dumps(payload).encode() if payload is not None else None,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=20) as response:
            return json.loads(response.read()), response.headers["X-Respawn-Reads"]

    def csrf(self, path: str) -> str:
        html, _ = self.page(path)
        return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)

    def log_in(self) -> None:
        token = self.csrf("/login/")
        self.page("/login/", {"csrfmiddlewaretoken": token, "username": "olivia",
                              "password": "pw-operator"})  # fmt: skip

    def forget_write(self) -> None:
        """Drop the marker a write left (as its expiry does, RESPAWN_REPLICA_STICKY later)."""
        self.jar.clear(urllib.parse.urlsplit(self.base).hostname, "/", "respawn_primary")


@pytest.fixture(scope="module")
def deployment():
    primary = PostgresServer("primary").init().start()
    replica = None
    web = None
    try:
        primary.sql("CREATE DATABASE respawn")
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings_test",
            "DATABASE_URL": primary.url("respawn"),
            "RESPAWN_QUEUE": f"respawn-test-replica-{os.getpid()}",
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("RESPAWN_POOLER_SAFE", None)
        for args in (["migrate", "-v", "0"], ["shell", "-c", SETUP_USER]):
            done = subprocess.run(
                [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True,
                text=True,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
        token = done.stdout.strip().splitlines()[-1]
        replica = PostgresServer("replica").init_replica_of(primary).start()
        port = free_port()
        web = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
            cwd=ROOT,
            env={
                **env,
                "DATABASE_REPLICA_URL": replica.url("respawn"),
                "RESPAWN_REPLICA_MAX_LAG": str(MAX_LAG),
                "RESPAWN_REPLICA_STICKY": "5",
                "RESPAWN_DB_POOL": "1",
            },
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        base = f"http://127.0.0.1:{port}"

        def up():
            try:
                urllib.request.urlopen(base + "/login/", timeout=2)
                return True
            except OSError:
                assert web.poll() is None, "the web process exited"
                return False

        wait_for(up, timeout=30, interval=0.2, what="the web process")
        yield primary, replica, base, token
    finally:
        if web is not None:
            web.terminate()
            web.wait(timeout=10)
        if replica is not None:
            replica.stop()
        primary.stop()


def _on_replica(replica: PostgresServer, session_id: str, column: str = "title"):
    rows = replica.sql(f"SELECT {column} FROM {SESSIONS} WHERE id = '{session_id}'", "respawn")
    return rows[0][0] if rows else None


def test_reads_follow_the_replica_and_writers_read_their_writes(deployment):
    primary, replica, base, token = deployment
    web = Web(base, token)
    started, reads = web.api("/api/sessions", {"agent": "echo", "input": "hi", "title": "first"})
    assert reads == "primary"  # a write
    sid = started["id"]
    wait_for(lambda: _on_replica(replica, sid) == "first", timeout=20, what="replication")

    # The replica stops replaying; the primary goes on.
    replica.sql("SELECT pg_wal_replay_pause()", "respawn")
    try:
        primary.sql(f"UPDATE {SESSIONS} SET title = 'second' WHERE id = '{sid}'", "respawn")
        # A reader with no write of its own reads the replica: the title before.
        session, reads = web.api(f"/api/sessions/{sid}")
        assert (session["title"], reads) == ("first", "replica")

        # A person cancels it in the dashboard; the page after the action reads the
        # primary and shows it cancelled, though the replica still has it queued.
        web.log_in()
        token = web.csrf(f"/sessions/{sid}/")
        html, reads = web.page(f"/sessions/{sid}/actions/cancel/", {"csrfmiddlewaretoken": token})
        assert reads == "primary"
        assert 'data-status="cancelled"' in html and "second" in html
        html, reads = web.page(f"/sessions/{sid}/")
        assert reads == "primary" and 'data-status="cancelled"' in html
        assert _on_replica(replica, sid, "status") == "queued"

        # Once the marker is gone, the same person's pages read the replica again, except
        # an action's preview, which shows what the action would do now.
        web.forget_write()
        html, reads = web.page(f"/sessions/{sid}/")
        assert reads == "replica" and 'data-status="queued"' in html
        html, reads = web.page(f"/sessions/{sid}/preview/resume/")
        assert reads == "primary"

        # A replica that falls too far behind is not read at all.
        started_waiting = time.monotonic()
        session, reads = wait_for(
            lambda: (lambda s, r: (s, r) if r == "primary" else None)(
                *web.api(f"/api/sessions/{sid}")
            ),
            timeout=MAX_LAG + 20,
            interval=0.5,
            what="reads to leave the lagging replica",
        )
        assert session["status"] == "cancelled"
        assert time.monotonic() - started_waiting >= 1  # not before it lagged
    finally:
        replica.sql("SELECT pg_wal_replay_resume()", "respawn")

    # Caught up: reads come from the replica again, and it has everything.
    session, reads = wait_for(
        lambda: (lambda s, r: (s, r) if r == "replica" else None)(*web.api(f"/api/sessions/{sid}")),
        timeout=30,
        interval=0.5,
        what="reads to come back to the replica",
    )
    assert (session["title"], session["status"]) == ("second", "cancelled")


def test_a_replica_that_does_not_answer_leaves_reads_on_the_primary(deployment):
    primary, replica, base, token = deployment
    web = Web(base, token)
    started, _ = web.api("/api/sessions", {"agent": "echo", "input": "hi", "title": "third"})
    wait_for(lambda: _on_replica(replica, started["id"]) == "third", timeout=20, what="replication")
    replica.stop(mode="fast", remove=False)
    try:
        session, reads = wait_for(
            lambda: (lambda s, r: (s, r) if r == "primary" else None)(
                *web.api(f"/api/sessions/{started['id']}")
            ),
            timeout=20,
            interval=0.5,
            what="reads to move to the primary",
        )
        assert session["title"] == "third"
        assert web.api("/api/sessions?limit=5")[1] == "primary"
    finally:
        replica.start()
