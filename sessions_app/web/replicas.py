"""Reads of the dashboard's and the API's read-only pages from a read replica.

With DATABASE_REPLICA_URL set, settings add a `replica` database and this module's router.
The router sends a read to the replica only inside `replica_reads()`, which the middleware
opens around a GET or HEAD of a read-only page, and only for Respawn's own data (sessions,
steps, checkpoints, the audit log). Everything else reads the primary: workers, management
commands, the admin, every write and every read in a transaction, log-ins, API tokens, and
the pages that must see their own writes:

- action previews (`/sessions/<id>/preview/…`, the bulk action page) and action forms;
- any page a client asks for within RESPAWN_REPLICA_STICKY seconds after one of its own
  writes (a POST, PUT, PATCH or DELETE): the response to a write sets a short-lived cookie
  that keeps that client's reads on the primary until the replica has caught up;
- every page while the replica is more than RESPAWN_REPLICA_MAX_LAG seconds behind
  (checked at most once a second per process), or does not answer.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.http import HttpRequest, HttpResponse

log = logging.getLogger("respawn.replicas")

REPLICA = "replica"
# Set on the response to a write; while the browser holds it, its reads go to the primary.
STICKY_COOKIE = "respawn_primary"
# Which database a request's reads came from, for operators and tests.
READS_HEADER = "X-Respawn-Reads"
SAFE_METHODS = {"GET", "HEAD"}
# Respawn's own read-only pages (dashboard, audit log, JSON API).
READ_PAGES = re.compile(r"^/(sessions|audit|api)/")
# Pages that show what an action would do, or lead to one: always the primary.
PRIMARY_PAGES = re.compile(r"/(preview|actions|bulk|import)/")
# Models a read of which must see the latest write: a token just issued, a failed log-in.
PRIMARY_MODELS = {"apitoken", "loginfailure"}
LAG_CHECK_INTERVAL = 1.0

_replica_reads: ContextVar[bool] = ContextVar("respawn_replica_reads", default=False)


def configured() -> bool:
    return REPLICA in settings.DATABASES


@contextmanager
def replica_reads() -> Iterator[None]:
    """Reads of Respawn's data in this block may come from the replica."""
    token = _replica_reads.set(True)
    try:
        yield
    finally:
        _replica_reads.reset(token)


class ReplicaRouter:
    """Writes, migrations and anything outside `replica_reads()` use the primary."""

    def db_for_read(self, model, **hints) -> str | None:
        if not _replica_reads.get():
            return None
        meta = model._meta
        if meta.app_label != "sessions_app" or meta.model_name in PRIMARY_MODELS:
            return None
        # A read inside a transaction on the primary must see that transaction's writes.
        if connections[DEFAULT_DB_ALIAS].in_atomic_block:
            return None
        return REPLICA

    def db_for_write(self, model, **hints) -> str:
        return DEFAULT_DB_ALIAS

    def allow_relation(self, obj1, obj2, **hints) -> bool:
        return True  # the replica holds the primary's rows

    def allow_migrate(self, db, app_label, **hints) -> bool:
        return db == DEFAULT_DB_ALIAS


# The replica's lag, as last measured by this process: (when, seconds behind or None).
_lag_lock = threading.Lock()
_last_lag: tuple[float, float | None] = (0.0, None)

# Behind by: nothing when every WAL record received is replayed, else the age of the last
# transaction replayed (grows while replay is paused or slow and the primary writes on).
LAG_SQL = (
    "SELECT CASE WHEN pg_last_wal_receive_lsn() IS NULL"
    " OR pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0"
    " ELSE coalesce(extract(epoch FROM now() - pg_last_xact_replay_timestamp()), 0) END"
)


def replica_lag() -> float | None:
    """Seconds the replica is behind (None: it does not answer); measured at most once
    every LAG_CHECK_INTERVAL seconds per process."""
    global _last_lag
    checked_at, lag = _last_lag
    now = time.monotonic()
    if now - checked_at < LAG_CHECK_INTERVAL:
        return lag
    with _lag_lock:
        if _last_lag[0] != checked_at:  # another thread measured meanwhile
            return _last_lag[1]
        try:
            with connections[REPLICA].cursor() as cursor:
                cursor.execute(LAG_SQL)
                lag = float(cursor.fetchone()[0])
        except DatabaseError as exc:
            log.warning("read replica unavailable (%s); reading from the primary", exc)
            connections[REPLICA].close()
            lag = None
        _last_lag = (time.monotonic(), lag)
    return lag


def replica_failed() -> None:
    """Read from the primary until the next measure of the replica's lag."""
    global _last_lag
    connections[REPLICA].close()
    _last_lag = (time.monotonic(), None)


def reads_from_replica(request: HttpRequest) -> bool:
    if request.method not in SAFE_METHODS or STICKY_COOKIE in request.COOKIES:
        return False
    path = request.path_info
    if not READ_PAGES.match(path) or PRIMARY_PAGES.search(path):
        return False
    lag = replica_lag()
    return lag is not None and lag <= settings.RESPAWN_REPLICA_MAX_LAG


class ReplicaReadsMiddleware:
    """Serves read-only pages from the replica (see the module's docstring), and keeps a
    client that has just written on the primary for RESPAWN_REPLICA_STICKY seconds."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not configured():
            return self.get_response(request)
        if reads_from_replica(request):
            with replica_reads():
                response = self.get_response(request)
            if not getattr(request, "_replica_failed", False):
                response[READS_HEADER] = REPLICA
                return response
            # The replica failed under this page: the page again, from the primary (a GET
            # of a read-only page writes nothing, so running it twice is harmless).
        response = self.get_response(request)
        response[READS_HEADER] = "primary"
        if request.method not in SAFE_METHODS:
            response.set_cookie(
                STICKY_COOKIE,
                "1",
                max_age=max(1, int(settings.RESPAWN_REPLICA_STICKY)),
                httponly=True,
                samesite="Lax",
                secure=settings.SESSION_COOKIE_SECURE,
            )
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> None:
        failed_on_replica(request, exception)


def failed_on_replica(request: HttpRequest, exception: BaseException) -> bool:
    """A database error met while this request read the replica: noted, so that the
    middleware serves the page again from the primary (whoever turned the error into a
    response: the API's handlers answer before the middleware sees it)."""
    if _replica_reads.get() and isinstance(exception, DatabaseError):
        log.warning("read replica failed (%s); reading from the primary", exception)
        request._replica_failed = True  # type: ignore[attr-defined]
        replica_failed()
        return True
    return False
