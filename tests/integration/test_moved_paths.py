"""Dotted paths from before sessions_app's layout keep working: jobs a running deployment
queued in Redis and settings that name a module where it used to be (sessions_app/__init__.py
maps them to where it lives now)."""

from __future__ import annotations

import importlib
import os
import time

import pytest
from django.conf import settings
from django.utils.module_loading import import_string
from rq.job import Job

import sessions_app
from sessions_app.models import AgentSession, Status
from sessions_app.services.core import session_start

from ..conftest import wait_for, wait_stopped
from ..servers import WorkerProcess

pytestmark = pytest.mark.django_db(transaction=True)

# What settings, handlers and queued jobs named before the move, and what each must be.
OLD_NAMES = {
    "sessions_app.jobs.run_session_job": "sessions_app.workers.jobs.run_session_job",
    "sessions_app.jobs.run_branch_job": "sessions_app.workers.jobs.run_branch_job",
    "sessions_app.worker.RespawnWorker": "sessions_app.workers.worker.RespawnWorker",
    "sessions_app.admin_config.RespawnAdminConfig": "sessions_app.apps.RespawnAdminConfig",
    "sessions_app.views.page_not_found": "sessions_app.dashboard.views.page_not_found",
    "sessions_app.views.csrf_failure": "sessions_app.dashboard.views.csrf_failure",
    "sessions_app.middleware.DatabaseUnavailableMiddleware": (
        "sessions_app.web.middleware.DatabaseUnavailableMiddleware"
    ),
    "sessions_app.replicas.ReplicaRouter": "sessions_app.web.replicas.ReplicaRouter",
    "sessions_app.auth.LoginThrottleBackend": "sessions_app.web.auth.LoginThrottleBackend",
    "sessions_app.store_postgresql.PostgreSQLSessionStore": (
        "sessions_app.store.postgresql.PostgreSQLSessionStore"
    ),
}


@pytest.mark.parametrize("old, new", sorted(OLD_NAMES.items()))
def test_an_old_dotted_path_is_the_object_at_its_new_one(old, new):
    assert import_string(old) is import_string(new)


def test_an_old_module_is_the_new_module_itself():
    """One module object under both names: patching or reading either sees the same."""
    old = importlib.import_module("sessions_app.jobs")
    new = importlib.import_module("sessions_app.workers.jobs")
    assert old is new
    assert new.__name__ == new.__spec__.name == "sessions_app.workers.jobs"


def test_every_moved_name_imports():
    for old, new in sessions_app.MOVED.items():
        assert importlib.import_module(f"sessions_app.{old}") is importlib.import_module(
            f"sessions_app.{new}"
        ), old


def test_a_name_that_never_existed_still_fails():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("sessions_app.no_such_module")


def test_a_job_queued_under_the_old_name_runs_in_a_worker_named_by_its_old_class(
    worker_env, rq_queue, tmp_path
):
    """A deployment upgraded with jobs still queued and the worker class in its settings
    spelt the old way: the worker starts, takes the old job and runs the session."""
    session = session_start(agent="demo", input="what is 2+2")
    rq_queue.empty()  # the job session_start queued under the new name: gone
    job = rq_queue.enqueue(
        "sessions_app.jobs.run_session_job", str(session.id), job_id=f"old-{session.id}"
    )
    assert job.func_name == "sessions_app.jobs.run_session_job"
    # The deployment recorded that job as the session's dispatch: the reconciler sees it
    # waiting and queues no other (a slow worker start would have it dispatch afresh).
    AgentSession.objects.filter(id=session.id).update(job_id=job.id)
    name = f"old-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    worker = WorkerProcess(
        worker_env,
        tmp_path / f"{name}.log",
        name,
        settings.RESPAWN_QUEUE,
        worker_class="sessions_app.worker.RespawnWorker",
    )
    try:
        wait_stopped(session)
        assert session.status == Status.COMPLETED, worker.log()
        # The session is committed before its job returns: the job is finished a moment
        # after.
        done = Job.fetch(job.id, connection=rq_queue.connection)
        wait_for(lambda: done.get_status(refresh=True) == "finished", what="the old job")
        assert done.return_value() == "completed", worker.log()
        assert AgentSession.objects.get(id=session.id).job_id == job.id, "dispatched again"
    finally:
        worker.stop()
