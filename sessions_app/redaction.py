"""The one choke point between Respawn and its database for anything a person, an agent or
a tool wrote: every free-text and JSON column is one of the field classes below, and a
field scrubs its value on every way Django writes it (save, create, bulk_create, update,
bulk_update). Scrubbing replaces secrets with markers (agent_runtime.redaction, with the
deployment's patterns and the configured secrets) and makes the text storable: PostgreSQL
holds no NUL character and no lone UTF-16 surrogate, in text or in jsonb, and such a value
would otherwise fail the write (a 500, or a worker's run).

The store's SQL path (sessions_app/store/postgresql.py), which writes steps and checkpoints without
the ORM, calls `scrub` itself. Django's admin history (LogEntry) gets the same fields at
start-up (`apps.SessionsAppConfig.ready`), so a title typed into the admin reaches its
change history redacted too.

The fields deconstruct as the plain Django fields: scrubbing changes no column, so
migrations (and the historical models of data migrations) see the plain ones.
"""

from __future__ import annotations

import re
from typing import Any

from django.db import models

from .fields import compact_json

# What PostgreSQL refuses in text and jsonb: NUL, and surrogates (valid only in pairs in
# UTF-16; a Python string can hold a lone one, which has no UTF-8 encoding).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def storable(value: Any) -> Any:
    """A copy of a JSON-like value whose strings (and keys) PostgreSQL can store."""
    if isinstance(value, str):
        return _UNSTORABLE.sub(REPLACEMENT, value) if _UNSTORABLE.search(value) else value
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable(item) for item in value]
    return value


def scrub(value: Any) -> Any:
    """What every stored copy of a value goes through: secrets redacted, text storable."""
    if value is None or isinstance(value, bool | int | float):
        return value
    from .runtime import redactor  # settings decide the patterns: not at import time

    return storable(redactor().redact(value))


def scrubbed_json(value: Any) -> str:
    """`scrub`, then compact JSON text for a json or jsonb parameter (the store's SQL path):
    the walk that makes text storable runs only when the JSON shows a NUL or a surrogate
    escape."""
    from .runtime import redactor

    clean = redactor().redact(value)
    text = compact_json(clean)
    if "\\u0000" in text or "\\ud" in text:
        text = compact_json(storable(clean))
    return text


class _Scrubbed(models.Field):
    """Mixed in before a concrete field (CharField, TextField, JSONField): its super() is
    that field."""

    plain_path = ""

    def scrub(self, value: Any) -> Any:
        return scrub(value)

    def pre_save(self, model_instance, add):
        # The instance gets the scrubbed value too: what the caller shows next (a page,
        # the admin's history and messages, str(obj)) is what was stored.
        value = super().pre_save(model_instance, add)
        clean = self.scrub(value)
        if clean != value:
            setattr(model_instance, self.attname, clean)
        return clean

    def get_db_prep_save(self, value, connection):
        # QuerySet.update() and bulk_update() reach the column through here, not pre_save.
        if not hasattr(value, "resolve_expression"):
            value = self.scrub(value)
        return super().get_db_prep_save(value, connection)

    def deconstruct(self):
        name, _path, args, kwargs = super().deconstruct()
        return name, self.plain_path, args, kwargs


class ScrubbedCharField(_Scrubbed, models.CharField):
    plain_path = "django.db.models.CharField"

    def scrub(self, value: Any) -> Any:
        # A marker can be longer than what it replaced: cut to the column's length (the
        # cut text is scrubbed text, so no part of a secret comes back).
        value = scrub(value)
        if isinstance(value, str) and self.max_length and len(value) > self.max_length:
            value = value[: self.max_length]
        return value


class ScrubbedTextField(_Scrubbed, models.TextField):
    plain_path = "django.db.models.TextField"


class ScrubbedJSONField(_Scrubbed, models.JSONField):
    plain_path = "django.db.models.JSONField"


def scrub_admin_history() -> None:
    """Give Django's LogEntry (admin change history) the scrubbing fields: its object_repr
    is str() of what was edited, and its change message names what changed."""
    from django.contrib.admin.models import LogEntry

    swaps: dict[type, type[_Scrubbed]] = {
        models.CharField: ScrubbedCharField,
        models.TextField: ScrubbedTextField,
    }
    for name in ("object_repr", "change_message"):
        field = LogEntry._meta.get_field(name)
        if not isinstance(field, _Scrubbed):
            field.__class__ = swaps[type(field)]
