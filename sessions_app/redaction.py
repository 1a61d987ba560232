"""The one choke point between Respawn and its database for anything a person, an agent or
a tool wrote: every free-text and JSON column is one of the field classes below, and a
field treats its value on every way Django writes it (save, create, bulk_create, update,
bulk_update).

- Text columns (titles, notes, errors: text for people, never read back by a run) are
  scrubbed: secrets replaced with markers (agent_runtime.redaction, with the deployment's
  patterns and the configured secrets), and made storable (PostgreSQL holds no NUL and no
  lone UTF-16 surrogate).
- JSON columns hold what a run reads back, so they are never rewritten: a value with a
  secret in it, or one PostgreSQL would not give back as it is, is stored sealed
  (sessions_app.sealing: its masked view in the clear, the exact value encrypted), and a
  read through the field gives the masked view.

The store's SQL path (sessions_app/store/postgresql.py, store/graph.py), which writes steps
and checkpoints without the ORM, calls `scrubbed_json` itself. Django's admin history
(LogEntry) gets the text fields at start-up (`apps.SessionsAppConfig.ready`), so a title
typed into the admin reaches its change history redacted too.

The fields deconstruct as the plain Django fields: this changes no column, so migrations
(and the historical models of data migrations) see the plain ones.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from typing import Any

from django.db import models

from .fields import JSONTextField, compact_json
from .sealing import (
    SEALED,
    Sealed,
    decrypt_bytes,
    encrypt_bytes,
    envelope,
    is_envelope,
    opened,
    stored,
)

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
    """What every stored copy of a text value goes through: secrets redacted, text storable."""
    if value is None or isinstance(value, bool | int | float):
        return value
    from .runtime import redactor  # settings decide the patterns: not at import time

    return storable(redactor().redact(value))


def _jsonb_alters(value: Any) -> bool:
    """Whether PostgreSQL would not give this JSON value back as it is: a NUL or a lone
    surrogate in a string or key, a float jsonb writes out as an integer of another value
    (1e+23), the sealing envelope's own key."""
    if isinstance(value, str):
        return _UNSTORABLE.search(value) is not None
    if isinstance(value, float):
        return "e+" in repr(value)
    if isinstance(value, dict):
        return any(
            (isinstance(k, str) and (k == SEALED or _UNSTORABLE.search(k) is not None))
            or _jsonb_alters(v)
            for k, v in value.items()
        )
    if isinstance(value, list | tuple):
        return any(_jsonb_alters(item) for item in value)
    return False


def sealed(value: Any) -> Any:
    """What a JSON column stores for a value a run wrote: the value itself when it holds no
    secret and PostgreSQL keeps it as it is, else its envelope (masked view, exact value
    encrypted). A masked view read from a column stores the envelope it came from."""
    if isinstance(value, Sealed):
        return stored(value)
    if value is None or isinstance(value, bool | int):
        return value
    from .runtime import redactor

    masked = redactor().redact(value)
    if masked == value and not _jsonb_alters(value):
        return value
    return envelope(storable(masked), value)


# The type of a serialized value (a LangGraph channel's blob) that holds a secret: the
# serializer's own type after this prefix and the key's id, the bytes encrypted.
SEALED_BLOB = "sealed:"


def sealed_blob(kind: str, data: bytes | None) -> tuple[str, bytes | None]:
    """A serialized value as stored: as it is, or encrypted when its text shows a secret
    (the serializer's strings are in its bytes as UTF-8)."""
    if not data:
        return kind, data
    from .runtime import redactor

    text = data.decode("utf-8", "replace")
    if redactor().text(text) == text and not kind.startswith(SEALED_BLOB):
        return kind, data
    key_id, token = encrypt_bytes(data)
    return f"{SEALED_BLOB}{key_id}:{kind}", token


def opened_blob(kind: str, data: bytes) -> tuple[str, bytes]:
    """What `sealed_blob` stored, as the serializer wrote it."""
    if not kind.startswith(SEALED_BLOB):
        return kind, data
    key_id, _, inner = kind[len(SEALED_BLOB) :].partition(":")
    return inner, decrypt_bytes(key_id, data)


def scrubbed_json(value: Any) -> str:
    """`sealed`, as compact JSON text for a json or jsonb parameter (the store's SQL path):
    the walk for what jsonb would alter runs only when the text shows one of them."""
    text = plain_json(value)
    if text is not None:
        return text
    if isinstance(value, Sealed):
        return compact_json(stored(value))
    from .runtime import redactor

    return compact_json(envelope(storable(redactor().redact(value)), value))


def plain_json(value: Any) -> str | None:
    """`value` as compact JSON text when it is stored as it is; None when it is stored
    sealed (a secret in it, text jsonb would alter, or a sealed value written back). A
    statement may fill in parts of plain text (a checkpoint's agent and step count from
    the row it advances); a sealed value's exact copy is in its box, out of the
    statement's reach, and must be complete before it is sealed."""
    if isinstance(value, Sealed):
        return None
    text = compact_json(value)
    return text if _kept_plain(value, text) else None


def _kept_plain(value: Any, text: str) -> bool:
    """Whether `value`, not a sealed one, is stored as it is: no secret in it, nothing
    jsonb would alter. `text`: its compact JSON, or that with markers for parts a statement
    fills in (they show none of what is looked for): the walk for what jsonb would alter
    runs only when the text shows one of them."""
    from .runtime import redactor

    if redactor().redact(value) != value:
        return False
    return not (
        ("\\u0000" in text or "\\ud" in text or "e+" in text or SEALED in text)
        and _jsonb_alters(value)
    )


def fillable_json(
    value: dict[str, Any], paths: Sequence[tuple[str, ...]]
) -> tuple[str, list[str]] | None:
    """`value` as compact JSON text with a marker at each of `paths` whose parent object is
    there, for a statement to fill in what only the database knows (a checkpoint's agent
    and step count from the row it advances) by replacing each marker's text, in order:
    the text stays compact and in `value`'s order, as a `json` column keeps it. The marker
    texts are returned with it; each is unique to this call (a string no value holds).
    None when `value` is stored sealed (plain_json)."""
    marked = dict(value)
    markers = []
    for path in paths:
        # Not uuid4: a program's tests may make that predictable for their own ids.
        marker = f"\x01{secrets.token_hex(16)}"
        markers.append(json.dumps(marker))
        parent = marked
        for key in path[:-1]:
            child = parent.get(key)
            if not isinstance(child, dict):
                break  # not there: nothing to fill in (as jsonb_set leaves it)
            copy = dict(child)  # the caller's value is left as it is
            parent[key] = copy
            parent = copy
        else:
            parent[path[-1]] = marker
    text = compact_json(marked)
    if isinstance(value, Sealed) or not _kept_plain(value, text):
        return None
    return text, markers


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
    """A JSON column of what a run wrote: stored exactly (sealed where it must be), read
    as its masked view (`sessions_app.sealing`)."""

    plain_path = "django.db.models.JSONField"

    def scrub(self, value: Any) -> Any:
        return sealed(value)

    def pre_save(self, model_instance, add):
        # As with text, the instance then holds what a read would give: the masked view
        # (which, written again, stores the same envelope).
        value = getattr(model_instance, self.attname)
        clean = sealed(value)
        if clean is value or not is_envelope(clean):
            return value
        view = opened(clean)
        setattr(model_instance, self.attname, view)
        return view

    def from_db_value(self, value, expression, connection):
        return opened(super().from_db_value(value, expression, connection))


class ScrubbedJSONTextField(ScrubbedJSONField, JSONTextField):
    """A ScrubbedJSONField kept as compact JSON text on PostgreSQL (a checkpoint's state)."""

    plain_path = "sessions_app.fields.JSONTextField"


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
