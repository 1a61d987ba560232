"""Key rotation for sealed values (sessions_app.sealing): every envelope and every sealed
blob under a key other than the current one, encrypted again under the current one. The
masked view a row shows does not change; nothing else of the row is touched."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db import models, transaction
from django.db.models.fields.json import KT

from ..models import (
    AuditEvent,
    Checkpoint,
    DemoRecord,
    GraphBlob,
    GraphCheckpoint,
    GraphWrite,
    SideEffect,
    Step,
)
from ..redaction import SEALED_BLOB
from ..sealing import SEALED, Sealed, current_key_id, decrypt_bytes, encrypt_bytes, opened
from ..sealing import resealed as _resealed
from ..sealing import stored as _stored

# Every JSON column that may hold an envelope.
JSON_COLUMNS: list[tuple[type[models.Model], str]] = [
    (Step, "payload"),
    (Checkpoint, "state"),
    (AuditEvent, "before"),
    (AuditEvent, "after"),
    (AuditEvent, "request_meta"),
    (SideEffect, "payload"),
    (DemoRecord, "payload"),
    (DemoRecord, "output"),
    (GraphCheckpoint, "metadata"),
]
BLOB_TABLES: list[type[models.Model]] = [GraphBlob, GraphWrite]


def _batches(queryset: models.QuerySet[Any], fields: tuple[str, ...], size: int) -> Iterator[list]:
    last = None
    while True:
        page = queryset.order_by("pk")
        if last is not None:
            page = page.filter(pk__gt=last)
        rows = list(page.values_list("pk", *fields)[:size])
        if not rows:
            return
        yield rows
        last = rows[-1][0]


def stale_json(model: type[models.Model], column: str, key: str) -> models.QuerySet[Any]:
    # The envelope's key id as text (`#>>`): a read that json text columns (a checkpoint's
    # state) have as well as jsonb ones, where has_key's `?` is jsonb's alone.
    return (
        model._default_manager.alias(sealed_under=KT(f"{column}__{SEALED}__key"))
        .filter(sealed_under__isnull=False)
        .exclude(sealed_under=key)
    )


def stale_blobs(model: type[models.Model], key: str) -> models.QuerySet[Any]:
    return model._default_manager.filter(type__startswith=SEALED_BLOB).exclude(
        type__startswith=f"{SEALED_BLOB}{key}:"
    )


def reseal(*, batch: int = 500, dry_run: bool = False) -> dict[str, int]:
    """Re-encrypt what was sealed under an older key; the count per table and column."""
    key = current_key_id()
    counts: dict[str, int] = {}
    for model, column in JSON_COLUMNS:
        label = f"{model._meta.db_table}.{column}"
        counts[label] = 0
        for rows in _batches(stale_json(model, column, key), (column,), batch):
            with transaction.atomic():
                for pk, value in rows:
                    raw = _stored(value) if isinstance(value, Sealed) else value
                    new = _resealed(raw)
                    if new is None:
                        continue
                    counts[label] += 1
                    if not dry_run:
                        # The app's field stores a view as its envelope; a plain one as is.
                        written = opened(new) if isinstance(value, Sealed) else new
                        model._default_manager.filter(pk=pk).update(**{column: written})
    for model in BLOB_TABLES:
        label = f"{model._meta.db_table}.blob"
        counts[label] = 0
        for rows in _batches(stale_blobs(model, key), ("type", "blob"), batch):
            with transaction.atomic():
                for pk, kind, blob in rows:
                    old_key, _, inner = kind[len(SEALED_BLOB) :].partition(":")
                    data = decrypt_bytes(old_key, bytes(blob))
                    counts[label] += 1
                    if not dry_run:
                        new_key, token = encrypt_bytes(data)
                        model._default_manager.filter(pk=pk).update(
                            type=f"{SEALED_BLOB}{new_key}:{inner}", blob=token
                        )
    return counts
