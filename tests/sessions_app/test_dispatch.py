"""Enqueue after commit, and the reconciler, against the real Redis."""

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from rq.job import Job

from agent_runtime.state import SCHEMA_VERSION
from sessions_app.models import AgentSession, Status
from sessions_app.services.core import session_start
from sessions_app.services.dispatch import reconcile

pytestmark = pytest.mark.django_db(transaction=True)


def queued_ids(q):
    return set(q.get_job_ids())


def test_enqueue_happens_only_after_commit(rq_queue):
    with transaction.atomic():
        session = session_start(agent="echo", input="hi")
        # Inside the transaction: the row is invisible to workers, and so is the job.
        assert rq_queue.count == 0
        assert not Job.exists(session.job_id, connection=rq_queue.connection)
    assert queued_ids(rq_queue) == {session.job_id}
    job = Job.fetch(session.job_id, connection=rq_queue.connection)
    assert job.args == (str(session.id),)


def test_rolled_back_start_enqueues_nothing(rq_queue):
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            session_start(agent="echo", input="hi")
            raise RuntimeError("request failed after the insert")
    assert rq_queue.count == 0
    assert AgentSession.objects.count() == 0


def test_reconciler_dispatches_sessions_that_redis_lost(rq_queue, settings):
    settings.RESPAWN_DISPATCH_GRACE = 30
    session = session_start(agent="echo", input="hi")
    rq_queue.connection.flushdb()  # Redis loses every job
    assert reconcile() == []  # just dispatched: its job may still be on its way to Redis
    AgentSession.objects.filter(id=session.id).update(
        dispatched_at=timezone.now() - timedelta(seconds=2)
    )
    # Well within the grace period, but the job is gone: nothing will run it.
    assert reconcile() == [str(session.id)]
    session.refresh_from_db()
    assert queued_ids(rq_queue) == {session.job_id}
    # A job still waiting in the queue is not dispatched again, however old.
    for age in (timedelta(seconds=2), timedelta(minutes=5)):
        AgentSession.objects.filter(id=session.id).update(dispatched_at=timezone.now() - age)
        assert reconcile() == []


def test_reconciler_leaves_a_recent_job_a_worker_took_until_the_grace_runs_out(rq_queue, settings):
    settings.RESPAWN_DISPATCH_GRACE = 30
    session = session_start(agent="echo", input="hi")
    job = Job.fetch(session.job_id, connection=rq_queue.connection)
    rq_queue.connection.lrem(rq_queue.key, 0, session.job_id)
    job.set_status("started")  # a worker took it and is about to claim the session
    AgentSession.objects.filter(id=session.id).update(
        dispatched_at=timezone.now() - timedelta(seconds=2)
    )
    assert reconcile() == []
    AgentSession.objects.filter(id=session.id).update(
        dispatched_at=timezone.now() - timedelta(minutes=5)
    )
    assert reconcile() == [str(session.id)]  # that worker never got to it


def test_reconciler_takes_back_a_running_session_whose_lease_expired(rq_queue):
    session = session_start(agent="slow", input="count to 2")
    rq_queue.empty()  # the crashed worker had dequeued the job
    now = timezone.now()
    AgentSession.objects.filter(id=session.id).update(
        status=Status.RUNNING,
        lease_owner="dead-worker",
        lease_expires_at=now - timedelta(seconds=1),
        dispatched_at=now - timedelta(seconds=3),
    )
    assert reconcile() == [str(session.id)]
    # Dispatched once: the next pass sees it dispatched after the lease expired.
    assert reconcile() == []


def test_reconciler_leaves_live_leases_and_finished_sessions_alone(rq_queue):
    live = session_start(agent="slow", input="count to 2")
    done = session_start(agent="echo", input="hi")
    rq_queue.empty()
    old = timezone.now() - timedelta(minutes=5)
    AgentSession.objects.filter(id=live.id).update(
        status=Status.RUNNING,
        lease_owner="w",
        lease_expires_at=timezone.now() + timedelta(minutes=1),
        dispatched_at=old,
    )
    AgentSession.objects.filter(id=done.id).update(status=Status.COMPLETED, dispatched_at=old)
    assert reconcile() == []


def test_enqueue_failure_is_recorded_and_reconciled_later(rq_queue, settings, caplog):
    good = settings.RQ_QUEUES
    settings.RQ_QUEUES = {
        **good,
        settings.RESPAWN_QUEUE: {"URL": "redis://127.0.0.1:1/0", "DEFAULT_TIMEOUT": 60},
    }
    session = session_start(agent="echo", input="hi")  # Redis down: accepted anyway
    assert "could not enqueue session" in caplog.text
    session.refresh_from_db()
    assert session.status == Status.QUEUED and session.dispatched_at is not None
    assert reconcile() == []  # the reconciler cannot reach Redis either, and says so

    settings.RQ_QUEUES = good  # Redis is back
    AgentSession.objects.filter(id=session.id).update(
        dispatched_at=timezone.now() - timedelta(minutes=5)
    )
    assert reconcile() == [str(session.id)]
    assert rq_queue.count == 1


def test_reconciler_skips_incompatible_sessions_until_newer_code_runs_it(rq_queue):
    session = session_start(agent="echo", input="hi")
    rq_queue.empty()
    now = timezone.now()
    AgentSession.objects.filter(id=session.id).update(
        dispatched_at=now - timedelta(minutes=5),
        incompatible_reason="checkpoint at seq 3: written by schema version 99",
        incompatible_at=now,
        incompatible_code_schema=SCHEMA_VERSION,
        incompatible_agent_version="1",  # the echo agent's version here
    )
    assert reconcile() == []  # this code refused it already
    # Marked by older code (before a deploy): this code gets a try at it.
    AgentSession.objects.filter(id=session.id).update(incompatible_code_schema=SCHEMA_VERSION - 1)
    assert reconcile() == [str(session.id)]


def test_reconciler_retries_an_incompatible_session_on_another_agent_version(rq_queue):
    session = session_start(agent="echo", input="hi")
    rq_queue.empty()
    now = timezone.now()
    marked = dict(
        dispatched_at=now - timedelta(minutes=5),
        incompatible_reason="agent 'echo': this session already ran on version 2",
        incompatible_at=now,
        incompatible_code_schema=SCHEMA_VERSION,
    )
    AgentSession.objects.filter(id=session.id).update(**marked, incompatible_agent_version="1")
    assert reconcile() == []  # refused by a worker with the same echo version as this one
    AgentSession.objects.filter(id=session.id).update(incompatible_agent_version="0.9")
    assert reconcile() == [str(session.id)]  # this worker's echo is another version


def test_reconciler_leaves_a_session_of_a_missing_agent_to_code_that_has_it(rq_queue):
    session = session_start(agent="echo", input="hi")
    rq_queue.empty()
    now = timezone.now()
    AgentSession.objects.filter(id=session.id).update(
        agent="gone",
        dispatched_at=now - timedelta(minutes=5),
        incompatible_reason="unknown agent 'gone' on this worker",
        incompatible_at=now,
        incompatible_code_schema=SCHEMA_VERSION,
        incompatible_agent_version="",
    )
    assert reconcile() == []


def test_reconciler_sees_through_a_job_left_queued_outside_any_queue(rq_queue):
    """A worker killed between taking the job off the queue and starting it leaves the job
    'queued' in no queue at all; the session must still come back."""
    session = session_start(agent="echo", input="hi")
    assert (
        rq_queue.connection.lrem(rq_queue.key, 0, session.job_id) == 1
    )  # taken, then the taker died
    assert Job.fetch(session.job_id, connection=rq_queue.connection).get_status() == "queued"
    AgentSession.objects.filter(id=session.id).update(
        dispatched_at=timezone.now() - timedelta(minutes=5)
    )
    assert reconcile() == [str(session.id)]
    session.refresh_from_db()
    assert queued_ids(rq_queue) == {session.job_id}


def test_a_session_row_a_stuck_tool_holds_delays_no_other_sessions_recovery(rq_queue, settings):
    """A worker stopped inside a tool's fenced block holds its session's row (FOR SHARE,
    as the store's fence does) for as long as it is stopped. The reconciler skips that row
    and dispatches every other session on the same pass; the stuck one once it is free."""
    import concurrent.futures

    import psycopg

    from ..conftest import database_url

    settings.RESPAWN_DISPATCH_GRACE = 1
    stuck = session_start(agent="echo", input="a")
    other = session_start(agent="echo", input="b")
    rq_queue.connection.flushdb()  # both jobs lost: both need a dispatch
    long_ago = timezone.now() - timedelta(minutes=5)
    # The stuck session comes first in the reconciler's order (the oldest dispatch).
    AgentSession.objects.filter(id=stuck.id).update(dispatched_at=long_ago - timedelta(minutes=1))
    AgentSession.objects.filter(id=other.id).update(dispatched_at=long_ago)
    holder = psycopg.connect(database_url())
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        holder.execute(
            f"SELECT 1 FROM {AgentSession._meta.db_table} WHERE id = %s FOR SHARE", [stuck.id]
        )
        dispatched = pool.submit(_in_thread, reconcile).result(timeout=10)
        assert dispatched == [str(other.id)]
    finally:
        holder.rollback()  # the stuck worker goes on: a reconciler waiting on it goes too
        holder.close()
        pool.shutdown()
    assert reconcile() == [str(stuck.id)]


def _in_thread(call):
    from django.db import connection

    try:
        return call()
    finally:
        connection.close()


def test_an_operators_action_on_a_row_a_stuck_tool_holds_answers_busy_not_never(
    client, users, settings
):
    """The API's cancel of a session whose row a stopped worker holds: a 409 "busy" after
    RESPAWN_LOCK_WAIT, nothing changed, the web thread free again; once the worker lets go
    the cancel goes through."""
    import time

    import psycopg

    from sessions_app.models import ApiToken

    from ..conftest import database_url

    settings.RESPAWN_LOCK_WAIT = 1.0
    session = session_start(agent="echo", input="a")
    _, token = ApiToken.issue(users["operator"])
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    holder = psycopg.connect(database_url())
    try:
        holder.execute(
            f"SELECT 1 FROM {AgentSession._meta.db_table} WHERE id = %s FOR SHARE", [session.id]
        )
        began = time.monotonic()
        answer = client.post(
            f"/api/sessions/{session.id}/cancel", content_type="application/json", **auth
        )
        took = time.monotonic() - began
        assert answer.status_code == 409 and answer.json()["error"] == "busy", answer.content
        assert "try again" in answer.json()["detail"] and took < 5, took
        assert AgentSession.objects.get(id=session.id).status == Status.QUEUED
    finally:
        holder.rollback()
        holder.close()
    again = client.post(
        f"/api/sessions/{session.id}/cancel", content_type="application/json", **auth
    )
    assert again.status_code == 200, again.content
    assert AgentSession.objects.get(id=session.id).status == Status.CANCELLED


def test_a_run_its_worker_died_in_goes_before_sessions_that_have_not_started(rq_queue):
    """A burst of new sessions waits in the queue; a running session's worker dies. Its
    re-dispatch is at the front of the queue, not behind the burst."""
    waiting = [session_start(agent="echo", input=f"new {n}") for n in range(20)]
    assert rq_queue.count == 20
    crashed = session_start(agent="echo", input="was running")
    rq_queue.remove(crashed.job_id)  # the worker that died had dequeued it
    now = timezone.now()
    AgentSession.objects.filter(id=crashed.id).update(
        status=Status.RUNNING,
        lease_owner="dead-worker",
        lease_expires_at=now - timedelta(seconds=1),
        dispatched_at=now - timedelta(minutes=1),
    )
    assert reconcile() == [str(crashed.id)]
    crashed.refresh_from_db()
    assert rq_queue.job_ids[0] == crashed.job_id
    # The burst keeps its order behind it.
    assert rq_queue.job_ids[-20:] == [s.job_id for s in waiting]
