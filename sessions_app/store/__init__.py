"""The store: the only code that writes step, checkpoint and graph rows, moves a session's
fencing token or claims its lease.

- `base`: the rules both dialects write by (the fence, the rows an append writes, how
  rows load into the engine's records), abstract where the dialects differ;
- `postgresql`: an append in one statement, loads without ORM instances;
- `portable`: the ORM path SQLite takes in `make run`;
- `writes`: every write outside a worker's append (an operator's step, a program's items
  and steps, a start, a fork, an import, an admin edit, retention's deletes) and the fence,
  written once (`fence`);
- `graph`: a LangGraph thread's rows (checkpoints, pending writes, channel values).

`tests/architecture.py` (an import-linter contract in make test) keeps the rule: no module
outside this package writes those rows or moves a fence.

`session_store()` is the one place a dialect is chosen, by the default connection's vendor.
A subclass of a dialect class (a benchmark's timed store, say) keeps its dialect.
"""

from __future__ import annotations

from django.db import connection

from .base import (
    LATE_CALL_ACTION,
    DjangoEffects,
    DjangoRecords,
    DjangoSessionStore,
    count_failed_calls,
    model_usage,
)
from .portable import PortableSessionStore
from .postgresql import PostgreSQLSessionStore

__all__ = [
    "LATE_CALL_ACTION",
    "DjangoEffects",
    "DjangoRecords",
    "DjangoSessionStore",
    "PortableSessionStore",
    "PostgreSQLSessionStore",
    "count_failed_calls",
    "dialect",
    "model_usage",
    "session_store",
]


def dialect() -> type[DjangoSessionStore]:
    """The store class for the default database: one statement per append on PostgreSQL,
    the ORM path on anything else."""
    if connection.vendor == "postgresql":
        return PostgreSQLSessionStore
    return PortableSessionStore


def session_store() -> DjangoSessionStore:
    """A store for the default database, of the dialect `dialect()` names."""
    return dialect()()
