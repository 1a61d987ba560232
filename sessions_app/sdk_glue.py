"""What the LangGraph saver (sessions_app.langgraph.saver) and the OpenAI Agents session
(sessions_app.openai_agents.session) share: Django set up from Respawn's settings for a program
that is not a Django project, Respawn session ids derived from an SDK's own ids, and a
thread of their own for their database work.

Django is imported only when used: a program imports those modules before Django is set up.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

# The agent names a program's own sessions get when it writes them with RespawnSaver or
# RespawnSession and names no agent: that program runs them, not Respawn's workers (unless
# an agent of that name is registered), so the deploy gate leaves them to it and a graph
# thread waiting at an interrupt between the program's calls is no approval waiting.
CHECKPOINTER_AGENT = "langgraph"
SDK_SESSION_AGENT = "openai-agents"
PROGRAM_AGENTS = {
    CHECKPOINTER_AGENT: "a LangGraph program using RespawnSaver",
    SDK_SESSION_AGENT: "an OpenAI Agents SDK program using RespawnSession",
}


def ensure_django(conn_string: str | None = None) -> None:
    """Set Django up from Respawn's settings when the program has not; `conn_string` is the
    database then (unless DATABASE_URL says otherwise)."""
    from django.conf import settings

    if settings.configured:
        from django.apps import apps

        if not apps.ready:
            import django

            django.setup()
        return
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    if conn_string:
        os.environ.setdefault("DATABASE_URL", conn_string)
    import django

    django.setup()


def session_id_in(namespace: uuid.UUID, value: str, *, what: str) -> uuid.UUID:
    """The Respawn session of an SDK's id (`what` names it in errors): the id itself when
    it is a UUID in its canonical form (a session started from the dashboard or the API),
    else derived from it in `namespace` (uuid5)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"a {what} must be a non-empty string, got {value!r}")
    try:
        as_uuid = uuid.UUID(value)
    except ValueError:
        return uuid.uuid5(namespace, value)
    return as_uuid if str(as_uuid) == value else uuid.uuid5(namespace, value)


def now() -> datetime:
    from django.utils import timezone

    return timezone.now()


class OwnConnection:
    """An object's own database connection (a saver's, a session's), used by one thread at
    a time: whichever thread calls borrows it for the call, so its transactions are never
    the caller's (Django keeps a connection per thread, and a worker's own may be inside
    one) and a call costs no hop to another thread. The SDKs also call from their event
    loop, where Django refuses database calls: those calls run on a thread of the
    object's own. `close()` closes the connection."""

    def __init__(self, name: str, database: str = "default") -> None:
        self._name = name
        self._alias = database
        self._use = threading.RLock()  # one thread at a time on the connection
        self._holder: int | None = None
        self._connection: Any = None
        self._lock = threading.Lock()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` on the connection; waits for the thread using it."""
        if self._holder == threading.get_ident():
            return fn(*args, **kwargs)
        if _in_event_loop():
            return self._pool().submit(self.call, fn, *args, **kwargs).result()
        with self._use, self._borrowed():
            return fn(*args, **kwargs)

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` on the connection, awaited from an event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pool(), functools.partial(self.call, fn, *args, **kwargs)
        )

    def close(self) -> None:
        """Close the connection and stop the thread."""
        if _in_event_loop():
            # Django refuses database calls on an event loop: closed on the thread.
            self._pool().submit(self._disconnect).result()
        else:
            self._disconnect()
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)

    def _disconnect(self) -> None:
        with self._use:
            connection, self._connection = self._connection, None
            if connection is not None:
                _unplan(connection)
                connection.close()
                connection.dec_thread_sharing()

    @contextlib.contextmanager
    def _borrowed(self) -> Iterator[None]:
        """The connection is this thread's `connections[alias]` for the block (the
        thread's own, if it had one, afterwards)."""
        from django.db import connections

        if self._connection is None:
            self._connection = connections.create_connection(self._alias)
            self._connection.inc_thread_sharing()
            _plan_once(self._connection)
        previous = next(  # the thread's own, when it has one
            (c for c in connections.all(initialized_only=True) if c.alias == self._alias), None
        )
        connections[self._alias] = self._connection
        self._holder = threading.get_ident()
        try:
            yield
        finally:
            self._holder = None
            if previous is None:
                del connections[self._alias]
            else:
                connections[self._alias] = previous

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix=self._name
                )
            return self._executor


# A connection (a wrapper of Django's) whose prepared statements are planned once.
PLAN_ONCE = "respawn_plan_once"


def _plan_once(wrapper: Any) -> None:
    """Have PostgreSQL plan each statement prepared on this connection once (a generic
    plan, `plan_cache_mode = force_generic_plan`), from its first execution on, and never
    compile one (`jit = off`), on this connection and every one it reconnects with.

    By default PostgreSQL plans a prepared statement afresh at each of its first five
    executions: a saver's read of a thread (a recursive CTE) took 1.4-5 ms at each of them
    against 0.6-0.8 ms once planned, and a program, or each of LangGraph's tests, makes a
    saver and a few calls on a new connection. Its estimate of that read's rows is far
    too high (jsonb_each is counted as a hundred rows, each level of the recursion as ten
    times the one before), high enough for JIT compilation, which took 40 ms for a read
    that runs in 0.3. The connection is the object's own (a saver's, an SDK session's):
    no other code's statements run on it. Not behind a transaction-mode pooler
    (RESPAWN_POOLER_SAFE), where statements are not prepared and a SET would reach
    whichever server connection the pooler picked."""
    from django.conf import settings
    from django.db.backends.signals import connection_created

    if wrapper.vendor != "postgresql" or settings.RESPAWN_POOLER_SAFE:
        return
    setattr(wrapper, PLAN_ONCE, True)
    connection_created.connect(_planned_once, dispatch_uid=PLAN_ONCE)
    if wrapper.connection is not None:  # connected already: the signal was before
        _planned_once(type(wrapper), wrapper)


def _planned_once(sender: Any, connection: Any, **kwargs: Any) -> None:
    if getattr(connection, PLAN_ONCE, False):
        with connection.connection.cursor() as cursor:
            cursor.execute("SET plan_cache_mode = force_generic_plan; SET jit = off")


def _unplan(wrapper: Any) -> None:
    """Back to PostgreSQL's default before the connection is closed: a pooled one goes back
    to the pool (RESPAWN_DB_POOL), to serve other code next."""
    if getattr(wrapper, PLAN_ONCE, False) and wrapper.connection is not None:
        with contextlib.suppress(Exception), wrapper.connection.cursor() as cursor:
            cursor.execute("RESET plan_cache_mode; RESET jit")


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
