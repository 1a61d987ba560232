"""The RQ worker class: jobs run in a long-lived process under a supervisor, and the
reconciler runs on a timer beside them.

RQ's default worker forks a work horse for every job. On a 2-CPU machine that fork alone
costs 10-16 ms, and each horse opens a new PostgreSQL connection: most of the time from
enqueue to a session's first durable step. Respawn's worker instead runs jobs one after
the other in one process that keeps its connections (RQ's SimpleWorker), and keeps what
the fork was for, isolation, one level up: `manage.py rqworker` is a small supervisor that
forks that process once and starts a new one when it dies (SIGKILL, OOM killer, a native
crash in a tool). A session whose run died with it comes back through its lease, as before.

Set RESPAWN_WORKER_SUPERVISE=0 to run the worker without the supervisor (under a process
manager that restarts it, for instance).

The reconciler must not depend on Redis holding a scheduled job (Redis may have lost
everything), so every worker process runs it from a thread of its own; alerts are sent the
same way (AlertSender), from the outbox in PostgreSQL. Several workers
reconciling at once is safe: each dispatch is a conditional UPDATE that only one wins.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time

from django.conf import settings
from django.db import connections
from redis.exceptions import RedisError
from rq import SimpleWorker

log = logging.getLogger("respawn.worker")

# A process that died sooner than this after its start counts as a quick death: the
# supervisor waits longer before the next start (doubling, up to RESTART_DELAY_MAX).
QUICK_DEATH = 10.0
RESTART_DELAY = 0.1
RESTART_DELAY_MAX = 5.0
# While Redis is away the supervisor tries it this many seconds apart at most before it
# starts the next worker process.
WAIT_FOR_REDIS_MAX = 1.0


# A failure that repeats itself (the database down for minutes) is logged with its
# traceback once, then as one line at most this often, with how often it recurred.
REPEAT_LOG_INTERVAL = 60.0


class RepeatedErrors:
    """Logs a failing background pass without flooding the log: each distinct error (type
    and message) of one outage once, with its traceback; repeats as one line at most once
    per `interval`, with a count; the recovery in one line, which ends the outage.

    An outage shows several errors in turn (a restarting PostgreSQL answers "terminating
    connection", "shutting down", "connection refused", "starting up"), and a pass may meet
    them in any order: an error already logged in this outage is a repeat, not news."""

    def __init__(self, what: str, interval: float = REPEAT_LOG_INTERVAL) -> None:
        self.what = what
        self.interval = interval
        self._seen: set[tuple[str, str]] = set()
        self._since = self._logged = 0.0
        self._repeats = 0

    def failed(self, exc: BaseException) -> None:
        key = (type(exc).__name__, str(exc).strip())
        now = time.monotonic()
        if not self._seen:
            self._since, self._logged, self._repeats = now, now, 0
        if key not in self._seen:
            self._seen.add(key)
            log.error("%s failed: %s: %s", self.what, key[0], key[1], exc_info=exc)
            return
        self._repeats += 1
        if now - self._logged >= self.interval:
            log.error(
                "%s still failing (%d more time(s) in the last %.0fs): %s: %s",
                self.what,
                self._repeats,
                now - self._logged,
                key[0],
                key[1].splitlines()[0] if key[1] else "",
            )
            self._logged, self._repeats = now, 0

    def succeeded(self) -> None:
        if self._seen:
            log.warning(
                "%s works again (it had failed for %.0fs)",
                self.what,
                time.monotonic() - self._since,
            )
            self._seen.clear()


class Reconciler(threading.Thread):
    """Runs `dispatch.reconcile` every `interval` seconds (±20 %, to spread the passes of
    many workers apart), and also just after a live lease expires: a session whose worker
    died is dispatched again as soon as its lease runs out, not up to `interval` later.

    It learns the next expiry from the database at least every `watch` seconds (half a
    lease TTL): a lease's last heartbeat sets an expiry at most one TTL ahead, so a look
    within that time always sees it coming."""

    def __init__(self, interval: float, watch: float) -> None:
        super().__init__(name="respawn-reconciler", daemon=True)
        self.interval = interval
        self.watch = watch
        self.stopped = threading.Event()

    def run(self) -> None:
        from ..services.dispatch import next_lease_expiry, reconcile

        next_pass = time.monotonic() + min(1.0, self.interval)  # start soon
        errors = RepeatedErrors("reconciler")
        while True:
            now = time.monotonic()
            wake, due = min(next_pass, now + self.watch), next_pass <= now + self.watch
            try:
                expires_in = next_lease_expiry()
            except Exception as exc:
                errors.failed(exc)
                connections.close_all()
                expires_in = None
            if expires_in is not None and now + expires_in < wake:
                # Just after it runs out (a heartbeat may renew it meanwhile: then the
                # pass finds nothing and the next look finds the new expiry).
                wake, due = now + expires_in + random.uniform(0.02, 0.1), True
            if self.stopped.wait(max(0.0, wake - time.monotonic())):
                break
            if not due:
                continue
            try:
                reconcile()
                errors.succeeded()
            except Exception as exc:
                errors.failed(exc)
                connections.close_all()
            if time.monotonic() >= next_pass:
                next_pass = time.monotonic() + self.interval * random.uniform(0.8, 1.2)
        connections.close_all()


class SearchIndexer(threading.Thread):
    """Indexes the steps written since its last pass for the dashboard's search, every
    `interval` seconds (sessions_app.upkeep.search; an advisory lock lets one worker at a time)."""

    def __init__(self, interval: float) -> None:
        super().__init__(name="respawn-search-indexer", daemon=True)
        self.interval = interval
        self.stopped = threading.Event()

    def run(self) -> None:
        from ..upkeep.search import enabled, index_pending

        errors = RepeatedErrors("search indexer")
        while not self.stopped.wait(self.interval * random.uniform(0.8, 1.2)):
            try:
                if not enabled():
                    break
                index_pending()
                errors.succeeded()
            except Exception as exc:
                errors.failed(exc)
                connections.close_all()
        connections.close_all()


class AlertSender(threading.Thread):
    """Sends due alert deliveries every `interval` seconds on threads of its own
    (sessions_app.upkeep.alerts), and runs the alert sweep every `sweep_interval`. Every
    worker process runs one: claims skip each other's rows. Independent of Redis."""

    def __init__(self, interval: float, sweep_interval: float, concurrency: int) -> None:
        super().__init__(name="respawn-alerts", daemon=True)
        self.interval = interval
        self.sweep_interval = sweep_interval
        self.concurrency = max(1, concurrency)
        self.stopped = threading.Event()

    def run(self) -> None:
        from ..upkeep.alerts import Courier, sweep

        courier = Courier(self.concurrency)
        errors = RepeatedErrors("alert sender")
        next_sweep = time.monotonic() + self.sweep_interval * random.uniform(0.2, 1.0)
        while not self.stopped.wait(self.interval * random.uniform(0.8, 1.2)):
            try:
                if self.sweep_interval > 0 and time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + self.sweep_interval * random.uniform(0.8, 1.2)
                    sweep()
                courier.pass_once()
                errors.succeeded()
            except Exception as exc:
                errors.failed(exc)
                connections.close_all()
        courier.shutdown()
        connections.close_all()


class QuietRedisRetries(logging.Filter):
    """RQ logs every retry of a lost Redis connection as an error line (its dequeue loop,
    its pubsub thread every 2 s): the first passes, then one per `interval`."""

    def __init__(self, interval: float = REPEAT_LOG_INTERVAL) -> None:
        super().__init__()
        self.interval = interval
        self._logged: float | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if "could not connect to Redis" not in str(record.msg):
            return True
        now = time.monotonic()
        if self._logged is not None and now - self._logged < self.interval:
            return False
        self._logged = now
        return True


class RespawnWorker(SimpleWorker):
    # An idle worker whose Redis went away tries again at most this many seconds apart
    # (RQ's own pause doubles up to a minute: after a 30 s outage it took jobs again up
    # to half a minute late).
    max_connection_wait_time = 2.0

    def teardown(self) -> None:
        # A warm shutdown of an idle worker interrupts its blocking dequeue from the
        # signal handler. A connection made through Sentinel (redis-py's
        # SentinelManagedConnection) is not closed when a read is interrupted: it goes back
        # to the pool with the dequeue's answer still due, and the next command on it (the
        # worker's own death registration) waits behind the dequeue for minutes. Closing
        # the pool's connections first makes teardown open fresh ones.
        self.connection.connection_pool.disconnect()
        super().teardown()

    def work(self, *args, **kwargs):
        if settings.RESPAWN_WORKER_SUPERVISE:
            return Supervisor(self).run(lambda: self._work(*args, **kwargs))
        return self._work(*args, **kwargs)

    def _work(self, *args, **kwargs) -> bool:
        if not any(isinstance(f, QuietRedisRetries) for f in self.log.filters):
            self.log.addFilter(QuietRedisRetries())
        reconciler = None
        if settings.RESPAWN_RECONCILE_INTERVAL > 0:
            reconciler = Reconciler(
                settings.RESPAWN_RECONCILE_INTERVAL, watch=settings.RESPAWN_LEASE_TTL / 2
            )
            reconciler.start()
        if settings.RESPAWN_WORKER_METRICS_PORT > 0:
            from ..telemetry import serve_worker_metrics

            serve_worker_metrics(settings.RESPAWN_WORKER_METRICS_PORT)
        indexer = None
        if settings.RESPAWN_SEARCH_INTERVAL > 0:
            indexer = SearchIndexer(settings.RESPAWN_SEARCH_INTERVAL)
            indexer.start()
        alerts = None
        if settings.RESPAWN_ALERT_INTERVAL > 0:
            alerts = AlertSender(
                settings.RESPAWN_ALERT_INTERVAL,
                settings.RESPAWN_ALERT_SWEEP_INTERVAL,
                settings.RESPAWN_ALERT_CONCURRENCY,
            )
            alerts.start()
        try:
            return super().work(*args, **kwargs)
        finally:
            if reconciler is not None:
                reconciler.stopped.set()
            if indexer is not None:
                indexer.stopped.set()
            if alerts is not None:
                alerts.stopped.set()


class Supervisor:
    """Forks the worker process and starts a new one whenever it dies.

    The worker process runs in its own process group, so a terminal's Ctrl-C reaches only
    the supervisor, which passes SIGINT and SIGTERM on exactly once each: RQ's warm
    shutdown (finish the current job), and on a second signal its cold one. A worker
    process that exits by itself with status 0 (burst mode, --max-jobs, --max-idle-time,
    a shutdown) ends the supervisor too."""

    def __init__(self, worker: SimpleWorker) -> None:
        self.worker = worker
        self.child: int | None = None
        self.stopping: int | None = None

    def _forward(self, signum, frame) -> None:
        self.stopping = signum
        if self.child is not None:
            try:
                os.kill(self.child, signum)
            except ProcessLookupError:
                pass

    def run(self, work) -> bool:
        previous = {s: signal.signal(s, self._forward) for s in (signal.SIGTERM, signal.SIGINT)}
        supervisor = os.getpid()
        delay = RESTART_DELAY
        registered = False  # a dead worker process's registration left in Redis
        try:
            while True:
                if registered and not self._wait_for_redis():
                    return False
                registered = False
                started = time.monotonic()
                pid = os.fork()
                if pid == 0:
                    self._child(work, previous, supervisor)  # never returns
                self.child = pid
                if self.stopping is not None:  # a signal came before the child was known
                    os.kill(pid, self.stopping)
                _, status = os.waitpid(pid, 0)
                self.child = None
                if self.stopping is not None or os.waitstatus_to_exitcode(status) == 0:
                    return os.waitstatus_to_exitcode(status) == 0
                log.error(
                    "worker process %d died (%s); starting a new one",
                    pid,
                    _describe(status),
                )
                # Its registration in Redis says it is alive; the next one takes its name.
                registered = True
                delay = RESTART_DELAY if time.monotonic() - started > QUICK_DEATH else delay
                deadline = time.monotonic() + delay
                while self.stopping is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                if self.stopping is not None:
                    return False
                delay = min(delay * 2, RESTART_DELAY_MAX)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _wait_for_redis(self) -> bool:
        """Mark the dead worker process's registration dead, so that the next one may
        register under the same name; with Redis away, wait until it answers (a new
        process could not start without it: it would die at once, again and again, each
        with a traceback). One line when the wait starts, one a minute while it lasts, one
        when Redis is back. False when a signal asks the supervisor to stop meanwhile."""
        pause, began, logged = 0.1, time.monotonic(), 0.0
        while self.stopping is None:
            try:
                self.worker.register_death()
            except RedisError as exc:
                now = time.monotonic()
                if not logged or now - logged >= REPEAT_LOG_INTERVAL:
                    log.warning("worker %s: waiting for Redis (%s)", self.worker.name, exc)
                    logged = now
                deadline = now + pause
                while self.stopping is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                pause = min(pause * 2, WAIT_FOR_REDIS_MAX)
                continue
            if logged:
                log.warning(
                    "worker %s: Redis answers again (after %.1fs)",
                    self.worker.name,
                    time.monotonic() - began,
                )
            return True
        return False

    @staticmethod
    def _child(work, previous, supervisor: int) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        os.setpgrp()
        _stop_with_parent(supervisor)
        code = 1
        try:
            work()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except RedisError as exc:
            # RQ logged how its loop lost Redis, with the traceback; teardown failed too.
            log.error("worker process stops: Redis is unavailable (%s)", exc)
        except BaseException:
            log.exception("worker process failed")
        finally:
            logging.shutdown()
            os._exit(code)


def _stop_with_parent(supervisor: int) -> None:
    """Have the kernel send SIGTERM (RQ's warm shutdown) to this worker process when its
    supervisor dies, so that no worker outlives the supervisor that would replace it
    (Linux; elsewhere a process manager's group kill does the same)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() != supervisor:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"
