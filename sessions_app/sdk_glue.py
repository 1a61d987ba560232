"""What the LangGraph saver (sessions_app.langgraph.saver) and the OpenAI Agents session
(sessions_app.openai_agents.session) share: Django set up from Respawn's settings for a program
that is not a Django project, Respawn session ids derived from an SDK's own ids, and a
thread of their own for their database work.

Django is imported only when used: a program imports those modules before Django is set up.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import threading
import uuid
from collections.abc import Callable
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


class DatabaseThread:
    """One thread, started on first use, for an object's database work: the SDKs call from
    their event loop (where Django refuses database calls) or from threads of their own,
    and Django keeps a connection per thread; one thread keeps it to one connection, which
    `close()` closes."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._ident: int | None = None

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` on the thread (at once when already on it); waits."""
        if threading.get_ident() == self._ident:
            return fn(*args, **kwargs)
        return self._pool().submit(fn, *args, **kwargs).result()

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` on the thread, awaited from an event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool(), functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        """Close the thread's database connection and stop the thread."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            from django.db import connections

            executor.submit(connections.close_all).result()
            executor.shutdown(wait=True)
            self._ident = None

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix=self._name, initializer=self._mark
                )
            return self._executor

    def _mark(self) -> None:
        self._ident = threading.get_ident()
