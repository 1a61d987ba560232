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
"""

from __future__ import annotations

import json
from typing import Any

from django.db.backends.signals import connection_created
from django.dispatch import receiver


def compact_json(value: Any) -> str:
    """JSON text without the blanks after separators (what a `json` column keeps as is)."""
    return json.dumps(value, separators=(",", ":"))


@receiver(connection_created, dispatch_uid="respawn-json-as-text")
def _json_as_text(sender, connection, **kwargs) -> None:
    if connection.vendor == "postgresql":
        from psycopg.types.string import TextLoader

        connection.connection.adapters.register_loader("json", TextLoader)
