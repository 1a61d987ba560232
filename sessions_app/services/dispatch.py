"""Getting sessions to workers: enqueue after commit, and the reconciler.

Redis is only a wake-up signal. The truth is the session row: a runnable status, a lease
that is live or not, and when the session was last dispatched. The reconciler reads only
PostgreSQL (plus a look at the job it last dispatched), so it brings sessions back even
after Redis lost every job.
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import timedelta
from typing import Any

import django_rq
from django.conf import settings
from django.db import transaction
from django.db.models import Case, F, Q, When
from django.db.models.functions import Now
from django.utils import timezone
from redis import Redis
from redis.exceptions import RedisError
from rq.job import Job, JobStatus

from agent_runtime.state import SCHEMA_VERSION

from ..models import RUNNABLE, AgentSession, Status
from ..models.clock import database_now
from ..runtime import agent_registry

log = logging.getLogger("respawn.dispatch")

RUN_JOB = "sessions_app.workers.jobs.run_session_job"
BRANCH_JOB = "sessions_app.workers.jobs.run_branch_job"


def redis_connection() -> Redis:
    """The one way Respawn opens Redis: django-rq's connection from RQ_QUEUES, which
    settings build from REDIS_URL, or from REDIS_SENTINELS and REDIS_SENTINEL_MASTER (then
    each new connection goes to the master the Sentinels name, the new one after a
    failover). The workers (`manage.py rqworker`) and the queue pages get theirs from the
    same settings through django-rq."""
    return django_rq.get_connection(settings.RESPAWN_QUEUE)


def queue():
    return django_rq.get_queue(settings.RESPAWN_QUEUE, connection=redis_connection())


def new_job_id(session_id) -> str:
    return f"run-{session_id}-{uuid.uuid4().hex[:12]}"


def enqueue(session_id, job_id: str, *, first: bool = False) -> bool:
    """Put a run job on the queue (`first`: at its front, before every waiting job). A Redis
    failure is logged, not raised: the session is recorded as dispatched in PostgreSQL and
    the reconciler will try again."""
    try:
        queue().enqueue(
            RUN_JOB,
            str(session_id),
            job_id=job_id,
            at_front=first,
            job_timeout=settings.RQ_QUEUES[settings.RESPAWN_QUEUE]["DEFAULT_TIMEOUT"],
            result_ttl=600,
            failure_ttl=86400,
        )
        return True
    except RedisError as exc:
        log.warning("could not enqueue session %s (%s); the reconciler will retry", session_id, exc)
        return False


def enqueue_branches(session_id, seqs) -> None:
    """One job per fan-out branch, carrying only the session id and the call's seq. A lost
    one is not retried from here: the lease the branches heartbeat expires, and the
    session's next run fans the unanswered calls out again."""
    for seq in seqs:
        try:
            queue().enqueue(
                BRANCH_JOB,
                str(session_id),
                int(seq),
                job_id=f"branch-{session_id}-{seq}-{uuid.uuid4().hex[:8]}",
                job_timeout=settings.RQ_QUEUES[settings.RESPAWN_QUEUE]["DEFAULT_TIMEOUT"],
                result_ttl=600,
                failure_ttl=86400,
            )
        except RedisError as exc:
            log.warning("could not enqueue branch %s of %s (%s)", seq, session_id, exc)


def dispatch_now(session_id) -> None:
    """Record a dispatch of the session's next run and enqueue it (outside a transaction:
    the write that made it runnable has committed)."""
    job_id = new_job_id(session_id)
    AgentSession.objects.filter(id=session_id).update(job_id=job_id, dispatched_at=Now())
    enqueue(session_id, job_id)


def dispatch_on_commit(session: AgentSession) -> None:
    """Record the dispatch in this transaction; enqueue only once it has committed, so a
    worker never sees a session that does not exist yet."""
    job_id = new_job_id(session.id)
    AgentSession.objects.filter(id=session.id).update(job_id=job_id, dispatched_at=Now())
    # The row holds the database's time; this copy this process's (close enough to show).
    session.job_id, session.dispatched_at = job_id, timezone.now()
    session_id = session.id
    transaction.on_commit(lambda: enqueue(session_id, job_id))


def _job_state(job_id: str, connection) -> str:
    """Where the session's last job is: "waiting" in its queue (or scheduled), "taken" by
    a worker (started), or "gone" (missing because Redis lost it, finished, failed, or
    left "queued" in no queue at all).

    The job's status alone is not enough: a worker killed between taking a job off the
    queue and marking it started leaves it "queued" forever, in no queue at all. So a
    queued job must also be found in its queue's list (LPOS)."""
    if not job_id:
        return "gone"
    try:
        job = Job.fetch(job_id, connection=connection)
    except Exception:  # missing (Redis lost it) or unreadable: not waiting
        return "gone"
    status = job.get_status(refresh=False)
    if status in {JobStatus.SCHEDULED, JobStatus.DEFERRED}:
        return "waiting"
    if status == JobStatus.STARTED:
        return "taken"
    if status != JobStatus.QUEUED:
        return "gone"
    return "waiting" if queue().get_job_position(job_id) is not None else "gone"


# A dispatch younger than this is left alone even if its job cannot be seen: the job is
# enqueued just after the dispatch commits.
ENQUEUE_SETTLE = 1.0


def next_lease_expiry() -> float | None:
    """Seconds until the first live lease of a runnable session runs out (None: no live
    lease). Read from the reconciler's partial index (runnable sessions by expiry)."""
    now = database_now()
    expires = (
        AgentSession.objects.filter(status__in=RUNNABLE, lease_expires_at__gt=now)
        .order_by("lease_expires_at")
        .values_list("lease_expires_at", flat=True)
        .first()
    )
    return None if expires is None else (expires - now).total_seconds()


def _marked_by_this_code() -> Q:
    """Sessions marked incompatible by a worker that had the same version of their agent
    as this one (so this one would refuse them too)."""
    registry = agent_registry()
    # An agent this code does not have either, marked by code that did not have it.
    marked = Q(incompatible_agent_version="") & ~Q(agent__in=registry.names())
    for agent in registry:
        marked |= Q(agent=agent.name, incompatible_agent_version=agent.version)
    return marked


def _redispatch(session_id: Any, dispatched_at: Any, job_id: str) -> bool:
    """Record a new dispatch, conditional on the one the reconciler read (of several
    reconcilers, one wins per session). A row someone holds a lock on is skipped, not
    waited for: a worker stopped inside a tool's fenced block holds its session's row, and
    waiting on it would stop the recovery of every other session. The next pass tries it
    again."""
    with transaction.atomic():
        free = (
            AgentSession.objects.filter(id=session_id, dispatched_at=dispatched_at)
            .select_for_update(skip_locked=True)
            .values_list("id", flat=True)
        )
        if not list(free):
            return False
        AgentSession.objects.filter(id=session_id).update(job_id=job_id, dispatched_at=Now())
        return True


class _RedisOutage:
    """The reconciler meets Redis down on every pass (a worker's runs every second or so):
    said when the outage starts, then once a minute, and when Redis answers again."""

    interval = 60.0

    def __init__(self) -> None:
        self.since: float | None = None
        self.logged = 0.0

    def failed(self, exc: BaseException) -> None:
        now = time.monotonic()
        if self.since is None:
            self.since = now
        elif now - self.logged < self.interval:
            return
        self.logged = now
        log.warning(
            "reconciler: Redis unavailable for %.0fs (%s); will try again", now - self.since, exc
        )

    def answered(self) -> None:
        if self.since is not None:
            log.warning(
                "reconciler: Redis answers again (after %.0fs)", time.monotonic() - self.since
            )
            self.since = None


_redis_outage = _RedisOutage()


def reconcile(*, limit: int | None = None) -> list[str]:
    """Dispatch again every runnable session that nobody is running and nothing will run.

    Candidates: queued or running, lease free or expired, and either never dispatched,
    dispatched longer ago than the grace period, (a running session) not dispatched since
    its lease expired, or dispatched recently but with its job gone from Redis (lost
    before a worker took it: there is nothing to wait for, so it is dispatched again on
    this pass, not after the grace period). A job that waits in its queue is left to its
    worker; a recent one that a worker has taken too.
    A session marked incompatible is skipped unless the code that marked it knew an older
    schema than this code, or another version of the session's agent (or none): after a
    deploy, the new code gets one try at it.
    Returns the ids dispatched.
    """
    limit = limit or settings.RESPAWN_RECONCILE_BATCH
    # Leases and dispatches are stamped with the database's clock: so are the comparisons.
    now = database_now()
    grace = now - timedelta(seconds=settings.RESPAWN_DISPATCH_GRACE)
    settled = now - timedelta(seconds=min(ENQUEUE_SETTLE, settings.RESPAWN_DISPATCH_GRACE))
    candidates = (
        AgentSession.objects.filter(status__in=RUNNABLE)
        # Leases expire on the database's clock (the store's claim and heartbeat).
        .filter(Q(lease_owner__isnull=True) | Q(lease_expires_at__lte=now))
        .filter(
            Q(dispatched_at__isnull=True)
            | Q(dispatched_at__lt=settled)
            | Q(status=Status.RUNNING, dispatched_at__lt=F("lease_expires_at"))
        )
        .filter(
            Q(incompatible_at__isnull=True)
            | Q(incompatible_code_schema__lt=SCHEMA_VERSION)
            | ~_marked_by_this_code()
        )
        # Runs a crash cut short first: their people have waited longest.
        .order_by(
            Case(When(status=Status.RUNNING, then=0), default=1),
            F("dispatched_at").asc(nulls_first=True),
        )
        .values_list("id", "job_id", "dispatched_at", "status", "lease_expires_at")[:limit]
    )
    try:
        connection = redis_connection()
        connection.ping()
    except RedisError as exc:
        _redis_outage.failed(exc)
        return []
    _redis_outage.answered()
    dispatched = []
    for session_id, job_id, dispatched_at, status, lease_expires_at in candidates:
        overdue = (
            dispatched_at is None
            or dispatched_at < grace
            or (status == Status.RUNNING and lease_expires_at and dispatched_at < lease_expires_at)
        )
        state = _job_state(job_id, connection)
        if state == "waiting" or (state == "taken" and not overdue):
            continue
        new_id = new_job_id(session_id)
        # A run that had started (its worker died, its lease expired) goes to the front of
        # the queue: before sessions that have not started, however many wait.
        recovered = status == Status.RUNNING
        if _redispatch(session_id, dispatched_at, new_id) and enqueue(
            session_id, new_id, first=recovered
        ):
            dispatched.append(str(session_id))
    if dispatched:
        from ..telemetry import DISPATCHES

        DISPATCHES.inc(len(dispatched))
        log.info("reconciler dispatched %d session(s): %s", len(dispatched), ", ".join(dispatched))
    return dispatched
