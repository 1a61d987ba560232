"""JSON as text: what lets a checkpoint's state move from `jsonb` to `json` on PostgreSQL
without a window in which a running release fails.

jsonb stores a value parsed, with a header per object, an entry per key and value and
numbers as `numeric`: for a checkpoint's state (small nested objects of counters and
names) that is about a quarter more than its compact JSON text (554 B against 400 B for
the bench's state; docs/PERFORMANCE.md). A state is written once a turn, read whole and
never indexed, so it can be kept as `json`. The conversion is a migration of its own;
this module is what every process needs before it runs:

- `compact_json`, the text the store writes (no blanks after separators: a `json` column
  keeps the text as it is given);
- a loader that hands a `json` value over as text, as Django has psycopg do for `jsonb`.
  Without it psycopg decodes `json` itself and a JSONField, which decodes what it is
  given, fails; with it a release reads the state on either column type.

It also has psycopg read a time Python cannot hold as the nearest one it can, rather than
fail the whole query (below).
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from typing import Any

from django.db import models
from django.db.backends.signals import connection_created
from django.dispatch import receiver
from psycopg.types.json import Json, Jsonb


def compact_json(value: Any) -> str:
    """JSON text without the blanks after separators (what a `json` column keeps as is)."""
    return json.dumps(value, separators=(",", ":"))


class JSONTextField(models.JSONField):
    """A JSONField kept as compact JSON text (`json`) on PostgreSQL: for a value written
    whole, read whole and never indexed (a checkpoint's state). Elsewhere a JSONField.

    Reads of a key (`->`, `->>`, `#>>`: Django's KT) work on `json` as on `jsonb`; the
    jsonb-only operators (`?`, `@>`: a key's `__isnull`, `__contains`) do not, and nothing
    uses them on such a column."""

    def db_type(self, connection):
        if connection.vendor == "postgresql":
            return "json"
        return super().db_type(connection)

    def get_db_prep_value(self, value, connection, prepared=False):
        value = super().get_db_prep_value(value, connection, prepared)
        if connection.vendor == "postgresql" and isinstance(value, Jsonb):
            encoder = self.encoder
            return Json(
                value.obj,
                dumps=lambda obj: json.dumps(obj, cls=encoder, separators=(",", ":")),
            )
        return value


@receiver(connection_created, dispatch_uid="respawn-json-as-text")
def _json_as_text(sender, connection, **kwargs) -> None:
    if connection.vendor == "postgresql":
        from psycopg.types.string import TextLoader

        connection.connection.adapters.register_loader("json", TextLoader)


# A time PostgreSQL holds but Python cannot (after 9999-12-31 or before the year 1 in UTC,
# or +-infinity: SQL written by hand, an older release's import) would fail every query
# that reads its row, and with it every page that lists the row. It is read as the nearest
# value Python has instead; a session row holding one is shown as damaged
# (AgentSession.damage) with a link to repair it in the admin (services.session_repair_times).
# Nothing is written back unless someone repairs or saves the row.
TOO_LATE = datetime.max.replace(tzinfo=UTC)
TOO_EARLY = datetime.min.replace(tzinfo=UTC)
UNREADABLE_TIMES = (TOO_LATE, TOO_EARLY)
# The times every page can show in every time zone: a day inside Python's range in UTC.
# What an import accepts; a repair moves a time outside them to the time of the repair.
READABLE_FROM = datetime(1, 1, 2, tzinfo=UTC)
READABLE_UNTIL = datetime(9999, 12, 30, tzinfo=UTC)


def _nearest(loader: type) -> type:
    """A loader reading what `loader` (psycopg's, or Django's for its time zone) reads, and
    an out-of-range value as the nearest one Python holds. It wraps rather than subclasses
    (psycopg's compiled loaders cannot be subclassed)."""
    from psycopg import DataError
    from psycopg.adapt import Loader

    name = loader.__name__.lower()  # DateLoader, TimestampLoader, Django's SpecificTzLoader
    high: date
    low: date
    if "date" in name:
        high, low = date.max, date.min
    elif "tz" in name:
        high, low = TOO_LATE, TOO_EARLY
    else:
        high, low = datetime.max, datetime.min

    class Nearest(Loader):
        # Django compares it with its connection's time zone before each query.
        timezone = getattr(loader, "timezone", None)

        def __init__(self, oid: int, context: Any = None) -> None:
            super().__init__(oid, context)
            self.inner = loader(oid, context)

        def load(self, data: Any) -> Any:
            try:
                return self.inner.load(data)
            except DataError:
                text = bytes(data).strip().lower()  # "10000-01-01 ...", "... BC", "-infinity"
                return low if text.endswith(b"bc") or text.startswith(b"-") else high

    Nearest.__name__ = f"Nearest{loader.__name__}"
    return Nearest


@receiver(connection_created, dispatch_uid="respawn-times-python-cannot-hold")
def _readable_times(sender, connection, **kwargs) -> None:
    # Text format only: Django has psycopg read every value as text.
    if connection.vendor == "postgresql":
        from psycopg.pq import Format

        adapters = connection.connection.adapters
        for name in ("timestamptz", "timestamp", "date"):
            current = adapters.get_loader(adapters.types[name].oid, Format.TEXT)
            if current is not None and not current.__name__.startswith("Nearest"):
                adapters.register_loader(name, _nearest(current))
