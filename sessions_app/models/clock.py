"""The database's clock, which leases and dispatches are kept on: a process whose own wall
clock runs fast or slow (a badly synced host) must compare them with the database's time,
never its own."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from django.db import connection

# How long a reading of the database's clock is carried forward on this process's
# monotonic clock (which a wall-clock step or drift of the host does not move).
REREAD_AFTER = 60.0

_reading: tuple[float, datetime] | None = None  # (time.monotonic(), the database's now)


def database_now() -> datetime:
    """The database's time now, read from it (one query)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT clock_timestamp()")  # now(): the transaction's start
        else:
            cursor.execute("SELECT STRFTIME('%Y-%m-%d %H:%M:%f', 'NOW')")
        now = cursor.fetchone()[0]
    if isinstance(now, str):  # SQLite: text, in UTC
        now = datetime.fromisoformat(now).replace(tzinfo=UTC)
    return now


def database_clock() -> datetime:
    """The database's time now, for the pages and checks that compare leases (is a lease
    live, is a session stuck): read from the database at most once a minute and carried
    forward on this process's monotonic clock in between, so a list of sessions costs no
    query per row, and a host whose wall clock is minutes off still sees live leases live
    and expired ones expired."""
    global _reading
    reading = _reading
    ticks = time.monotonic()
    if reading is None or ticks - reading[0] > REREAD_AFTER:
        before = time.monotonic()
        now = database_now()
        ticks = time.monotonic()
        # The middle of the query's round trip is when the database read its clock.
        reading = _reading = ((before + ticks) / 2, now)
    return reading[1] + timedelta(seconds=ticks - reading[0])
