"""Django's PostgreSQL backend, with a pooled connection handed out as soon as the server
(or the PgBouncer in front of it) accepts connections again. The web processes use it
(config.settings: ENGINE "config.postgresql" when they pool their connections).

Two pauses of psycopg_pool held requests off after a restart, each answered 503 after
RESPAWN_DB_WAIT although the server was up:

- The pool checks a connection as it leaves (an empty query) and, when the check fails,
  sleeps before it tries the next one (1 s, 2 s, ...). After PgBouncer or PostgreSQL
  restarted, every idle connection in the pool is broken: a request met one broken
  connection after another, with a pause between each. Here the pool does not check; the
  request checks each connection it takes itself, gives a broken one back (the pool drops
  it and opens another at once) and takes the next without a pause.
- A pool whose attempts to reconnect failed during an outage waits out its pause before
  the next attempt, however soon the server is back. Here a request that gets nothing from
  the pool within POOL_SLICE tries a connection of its own, used for that request and
  closed after it (at most the pool's max_size of them at a time).

A request still waits at most the pool's timeout (RESPAWN_DB_WAIT) in all.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
from django.db.backends.postgresql import base
from psycopg_pool import ConnectionPool, PoolTimeout

# How long a request waits for the pool before it tries a connection of its own.
POOL_SLICE = 0.25


class CheckedPool:
    """The process's psycopg pool, with `getconn` as the module's docstring says; the rest
    is the pool's own."""

    _own_lock = threading.Lock()
    _own = 0  # connections of their own open now, in this process

    def __init__(self, pool: ConnectionPool, configure: Any) -> None:
        self._pool = pool
        self._configure = configure

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    def getconn(self, timeout: float | None = None) -> psycopg.Connection:
        pool = self._pool
        deadline = time.monotonic() + (pool.timeout if timeout is None else timeout)
        error: Exception | None = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise error or PoolTimeout(f"no connection after {pool.timeout:.2f} sec")
            try:
                conn = pool.getconn(timeout=min(POOL_SLICE, left))
            except PoolTimeout as exc:
                error = error or exc
                own = self._connect_own(deadline - time.monotonic())
                if isinstance(own, Exception):
                    error = own
                    continue
                return own
            try:
                ConnectionPool.check_connection(conn)
            except psycopg.Error as exc:
                error = exc
                pool.putconn(conn)  # broken: the pool drops it and opens another
                continue
            return conn

    def _connect_own(self, left: float) -> psycopg.Connection | Exception:
        with CheckedPool._own_lock:
            if CheckedPool._own >= self._pool.max_size:
                return PoolTimeout("no connection in the pool, and as many of its own open")
            CheckedPool._own += 1
        try:
            kwargs = {**self._pool.kwargs, "connect_timeout": max(1, round(left))}
            conn = self._pool.connection_class.connect(self._pool.conninfo, **kwargs)
            self._configure(conn)
        except psycopg.Error as exc:
            self.release_own()
            return exc
        return conn

    @staticmethod
    def release_own() -> None:
        with CheckedPool._own_lock:
            CheckedPool._own -= 1


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self) -> Any:
        pool = super().pool
        return None if pool is None else CheckedPool(pool, self._configure_connection)

    def _close(self) -> None:
        conn = self.connection
        if conn is not None and self.pool is not None and getattr(conn, "_pool", None) is None:
            # A connection of its own (the pool had none to give): closed, not pooled.
            try:
                with self.wrap_database_errors:
                    conn.close()
            finally:
                self.connection = None
                CheckedPool.release_own()
            return
        super()._close()
