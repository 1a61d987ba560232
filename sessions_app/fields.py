"""JSONTextField: a JSONField kept as `json` (its text) on PostgreSQL instead of `jsonb`.

jsonb stores a value parsed, with a header per object, an entry per key and value and
numbers as `numeric`: for a checkpoint's state (small nested objects of counters and
names) that is about a quarter more than the compact JSON text (552 B against 400 B for
the bench's state). A checkpoint's state is written once a turn, read whole by a load or
a rollback and never indexed, so it is kept as text: the JSON operators (`->`, `->>`,
`#>`) work on `json` as on `jsonb`; what `json` lacks is equality and the jsonb-only
operators (`?`, `@>`): a key that must exist is tested with `KT(...)` and `isnull`.

On other databases it is the plain JSONField (SQLite stores text anyway).
"""

from __future__ import annotations

import json
from typing import Any

from django.db import models
from django.db.backends.signals import connection_created
from django.dispatch import receiver


def compact_json(value: Any) -> str:
    """JSON text without the blanks after separators (what a `json` column keeps as is)."""
    return json.dumps(value, separators=(",", ":"))


class JSONTextField(models.JSONField):
    def db_type(self, connection) -> str | None:
        if connection.vendor == "postgresql":
            return "json"
        return super().db_type(connection)

    def get_db_prep_value(self, value, connection, prepared=False):
        if connection.vendor != "postgresql":
            return super().get_db_prep_value(value, connection, prepared)
        from psycopg.types.json import Json

        if not prepared:
            value = self.get_prep_value(value)
        return Json(value, dumps=self._dumps)

    def _dumps(self, value: Any) -> str:
        if self.encoder is not None:
            return json.dumps(value, cls=self.encoder, separators=(",", ":"))
        return compact_json(value)


@receiver(connection_created, dispatch_uid="respawn-json-as-text")
def _json_as_text(sender, connection, **kwargs) -> None:
    # Django has psycopg hand jsonb over as text (JSONField decodes it, with the field's
    # decoder); a json column gets the same, or psycopg would decode it first.
    if connection.vendor == "postgresql":
        from psycopg.types.string import TextLoader

        connection.connection.adapters.register_loader("json", TextLoader)
