"""Respawn's worker: a supervisor and one long-lived worker process that runs the jobs, and
the reconciler's wake-up at the next lease expiry. Real rqworker processes, real signals."""

from __future__ import annotations

import signal
import time

import psutil
import pytest

from sessions_app.models import AgentSession, Status, Step
from sessions_app.services.core import session_start

from ..conftest import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _run_owner_pids(session: AgentSession) -> list[int]:
    """The process of each run of the session, from its run_started steps (host:pid:…)."""
    runs = Step.objects.filter(session=session, kind="system", payload__event="run_started")
    return [int(worker.split(":")[1]) for worker in runs.values_list("payload__worker", flat=True)]


def _wait_completed(session: AgentSession, timeout: float = 30) -> None:
    def completed():
        session.refresh_from_db()
        return session.status == Status.COMPLETED

    wait_for(completed, timeout=timeout, what=f"session {session.id} to complete")


def _ready(worker) -> list[int]:
    """The worker's process tree once the supervisor has forked its worker process: the one
    child that has said it started (a short-lived child of the supervisor's start-up is
    not it)."""

    def forked():
        pids = worker.pids()
        return len(pids) == 2 and f"started with PID {pids[1]}," in worker.log() and pids

    return wait_for(forked, what="the worker process")


def test_jobs_run_one_after_another_in_one_worker_process(start_worker):
    """No fork per job: every run of every session is the same process, which is the
    supervisor's one child."""
    worker = start_worker()
    supervisor, child = _ready(worker)
    owners = set()
    for _ in range(3):
        session = session_start(agent="slow", input="count to 2")
        _wait_completed(session)
        owners |= set(_run_owner_pids(session))
    assert owners == {child}
    assert worker.pids() == [supervisor, child]


def test_sigterm_stops_the_supervisor_and_its_worker_process(start_worker):
    worker = start_worker()
    supervisor, child = _ready(worker)
    worker.process.send_signal(signal.SIGTERM)
    worker.process.wait(timeout=15)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie"
    assert "starting a new one" not in worker.log()


def test_a_dead_worker_process_is_replaced_and_takes_jobs(start_worker):
    worker = start_worker()
    supervisor, child = _ready(worker)
    psutil.Process(child).kill()

    def replaced():
        pids = worker.pids()
        return len(pids) == 2 and pids[1] != child and pids[1]

    new = wait_for(replaced, what="a new worker process")
    session = session_start(agent="slow", input="count to 1")
    _wait_completed(session)
    assert _run_owner_pids(session) == [new]
    assert worker.process.poll() is None
    assert f"worker process {child} died (killed by SIGKILL)" in worker.log()


def test_a_dead_workers_session_is_taken_over_when_its_lease_expires(start_worker, settings):
    """The reconciler's period is far longer than the lease here, and both workers made
    their first pass before the session existed: the takeover must come from the wake-up
    at the lease's expiry, within lease TTL + 1 s of the kill."""
    env = {"RESPAWN_RECONCILE_INTERVAL": "60", "RESPAWN_SLOW_DELAY": "0.3"}
    workers = [start_worker(**env) for _ in range(2)]
    for worker in workers:
        _ready(worker)
    time.sleep(1.5)  # their first reconciler passes are behind them
    session = session_start(agent="slow", input="count to 30")
    wait_for(
        lambda: Step.objects.filter(session=session, kind="tool_result").exists(),
        what="the run to get going",
        interval=0.02,
    )
    (holder,) = _run_owner_pids(session)
    doomed = next(w for w in workers if holder in w.pids())
    (rescuer,) = [w for w in workers if w is not doomed]
    doomed.kill()
    killed = time.monotonic()
    wait_for(
        lambda: rescuer.pids()[1] in _run_owner_pids(session),
        timeout=settings.RESPAWN_LEASE_TTL + 10,
        interval=0.02,
        what="the other worker's run",
    )
    took = time.monotonic() - killed
    assert took < settings.RESPAWN_LEASE_TTL + 1.0, f"taken over {took:.2f}s after the kill"
    _wait_completed(session)


def test_the_worker_process_stops_when_its_supervisor_is_killed(start_worker):
    """No worker process outlives its supervisor: the kernel sends it SIGTERM (RQ's warm
    shutdown), and an idle one exits at once."""
    worker = start_worker()
    supervisor, child = _ready(worker)
    wait_for(lambda: "Listening on" in worker.log(), what="the worker to listen")
    psutil.Process(supervisor).kill()
    worker.process.wait(timeout=10)
    wait_for(
        lambda: not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie",
        timeout=15,
        what="the orphaned worker process to stop",
    )
    assert "warm shut down requested" in worker.log()
