"""Rewrite stored blobs (checkpoint states, step payloads) to the current schema version.

Shared by the data migrations, `manage.py upgrade_state` and the benchmark. The model classes
are passed in, so a migration can hand over its historical models (`apps.get_model`).

Batches walk each table by primary key (a keyset cursor, so refused rows are not read again
and again); each batch is its own short transaction that locks only the rows it rewrites.
Interrupting it at any point loses nothing: committed batches are done, the rest is still
at its old version, and old versions keep loading through the upgraders meanwhile. Running
it again skips what is already current, so a second run writes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import connections, models, transaction

from agent_runtime.state import SCHEMA_VERSION
from agent_runtime.upgraders import (
    IncompatibleSchemaError,
    downgrade_state_blob,
    downgrade_step_payload,
    load_step_payload,
    upgrade_state_blob,
)

from ..redaction import ScrubbedJSONField, sealed
from ..sealing import exact

DEFAULT_BATCH_SIZE = 500
MAX_LISTED_REFUSALS = 50


@dataclass(frozen=True)
class Refusal:
    """A row that could not be rewritten; it is left exactly as it was."""

    table: str
    row_id: int
    session_id: str
    seq: int
    error: str


@dataclass
class TableSummary:
    table: str
    total: int = 0  # rows in the table when the run started
    read: int = 0
    upgraded: int = 0
    current: int = 0
    refused: int = 0
    refusals: list[Refusal] = field(default_factory=list)  # the first MAX_LISTED_REFUSALS
    batches: int = 0  # transactions that rewrote rows
    max_transaction_seconds: float = 0.0
    max_transaction_rows: int = 0


@dataclass
class Summary:
    tables: list[TableSummary]
    dry_run: bool = False
    seconds: float = 0.0

    @property
    def refused(self) -> int:
        return sum(t.refused for t in self.tables)

    @property
    def upgraded(self) -> int:
        return sum(t.upgraded for t in self.tables)


@dataclass(frozen=True)
class _Table:
    label: str
    model: type[models.Model]
    blob_field: str
    fields: tuple[str, ...]  # what to read of a row to rewrite it
    convert: Callable[[Any], dict[str, Any]]  # a row -> its blob at the target version


def _tables(
    checkpoint_model, step_model, *, down_from: int | None = None, target: int = SCHEMA_VERSION
) -> list[_Table]:
    def state(row: Any) -> dict[str, Any]:
        if down_from is None:
            return upgrade_state_blob(exact(row.state), target).value
        return downgrade_state_blob(exact(row.state), down_from)

    def payload(row: Any) -> dict[str, Any]:
        if down_from is None:
            return load_step_payload(row.kind, exact(row.payload), row.schema_version, target).value
        return downgrade_step_payload(row.kind, exact(row.payload), down_from)

    return [
        _Table(
            "checkpoints",
            checkpoint_model,
            "state",
            ("id", "session_id", "seq", "schema_version", "state"),
            state,
        ),
        _Table(
            "steps",
            step_model,
            "payload",
            ("id", "session_id", "seq", "schema_version", "kind", "payload"),
            payload,
        ),
    ]


def _column_field(model: type[models.Model], name: str) -> models.Field:
    """The field `name` of `model` (a column of the table, not a relation's other end)."""
    field = model._meta.get_field(name)
    if not isinstance(field, models.Field):
        raise TypeError(f"{model.__name__}.{name} is not a column")
    return field


def _run_table(
    table: _Table,
    *,
    target: int,
    needs_rewrite: Callable[[int], bool],
    beyond_reach: Callable[[int], bool],
    batch_size: int,
    dry_run: bool,
    pause: float,
    using: str,
    on_batch: Callable[[TableSummary], None] | None,
) -> TableSummary:
    manager = table.model._default_manager.db_manager(using)
    connection = connections[using]
    meta = table.model._meta
    blob_field = _column_field(table.model, table.blob_field)
    quote = connection.ops.quote_name
    # One prepared UPDATE per row, sent in a batch: bulk_update's CASE WHEN per row costs
    # ten times as much Python as the rewrite itself.
    update_sql = (
        f"UPDATE {quote(meta.db_table)} SET {quote(blob_field.column)} = %s, "
        f"{quote(_column_field(table.model, 'schema_version').column)} = %s "
        f"WHERE {quote(meta.pk.column)} = %s"
    )
    summary = TableSummary(table.label, total=manager.count())
    after_id = 0  # the keyset cursor
    while True:
        # Cheap first pass over the batch: ids and versions only, no blobs.
        heads = list(
            manager.filter(id__gt=after_id)
            .order_by("id")
            .values_list("id", "schema_version")[:batch_size]
        )
        if not heads:
            break
        after_id = heads[-1][0]
        summary.read += len(heads)
        stale = [row_id for row_id, version in heads if needs_rewrite(version)]
        summary.current += sum(1 for _, version in heads if version == target)
        if stale:
            started = time.monotonic()
            with transaction.atomic(using=using):
                # The app's model or a migration's historical one: its fields are known
                # by name only.
                rows: models.QuerySet[Any] = (
                    manager.filter(id__in=stale).only(*table.fields).order_by("id")
                )
                if not dry_run:
                    # Rows are immutable apart from this rewrite, but two runs at once (the
                    # migration and the command) must not interleave on one row.
                    rows = rows.select_for_update()
                changed = []
                for row in rows:
                    if not needs_rewrite(row.schema_version):  # another run got here first
                        summary.current += row.schema_version == target
                        continue
                    try:
                        blob = table.convert(row)
                    except IncompatibleSchemaError as exc:
                        summary.refused += 1
                        if len(summary.refusals) < MAX_LISTED_REFUSALS:
                            summary.refusals.append(
                                Refusal(table.label, row.id, str(row.session_id), row.seq, str(exc))
                            )
                        continue
                    # A migration's historical model has the plain JSONField: seal here
                    # what the app's field would (a secret, what jsonb would alter).
                    if not isinstance(blob_field, ScrubbedJSONField):
                        blob = sealed(blob)
                    changed.append((blob_field.get_db_prep_save(blob, connection), target, row.pk))
                if changed and not dry_run:
                    with connection.cursor() as cursor:
                        cursor.executemany(update_sql, changed)
                summary.upgraded += len(changed)
            elapsed = time.monotonic() - started
            summary.batches += 1
            summary.max_transaction_seconds = max(summary.max_transaction_seconds, elapsed)
            summary.max_transaction_rows = max(summary.max_transaction_rows, len(changed))
        # Rows at a version the target cannot be reached from are counted as refused; rows
        # the run has no business with (past an upgrade's target, below a downgrade's) are
        # left alone.
        summary.refused += sum(1 for _, version in heads if beyond_reach(version))
        if on_batch is not None:
            on_batch(summary)
        if pause and stale:
            time.sleep(pause)
    return summary


def upgrade_blobs(
    checkpoint_model,
    step_model,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    dry_run: bool = False,
    pause: float = 0.0,
    using: str = "default",
    on_batch: Callable[[TableSummary], None] | None = None,
    target: int = SCHEMA_VERSION,
) -> Summary:
    """Rewrite every blob older than `target` (SCHEMA_VERSION unless a released data
    migration pins its own version) to it. Blobs that cannot be loaded (too new,
    malformed) are refused: counted, listed, left untouched."""
    started = time.monotonic()
    tables = [
        _run_table(
            table,
            target=target,
            # Rows newer than this code go through the loader too, so that they are
            # reported as refused (with the loader's reason); rows between target and this
            # code's version are left.
            needs_rewrite=lambda version: version < target or version > SCHEMA_VERSION,
            beyond_reach=lambda version: False,
            batch_size=batch_size,
            dry_run=dry_run,
            pause=pause,
            using=using,
            on_batch=on_batch,
        )
        for table in _tables(checkpoint_model, step_model, target=target)
    ]
    return Summary(tables=tables, dry_run=dry_run, seconds=time.monotonic() - started)


def downgrade_blobs(
    checkpoint_model,
    step_model,
    *,
    from_version: int,
    batch_size: int = DEFAULT_BATCH_SIZE,
    using: str = "default",
) -> Summary:
    """Rewrite every blob at `from_version` one version down (reversing a data migration).
    Blobs newer than `from_version` are refused: reverse the later migration first."""
    started = time.monotonic()
    target = from_version - 1
    tables = [
        _run_table(
            table,
            target=target,
            needs_rewrite=lambda version: version == from_version,
            beyond_reach=lambda version: version > from_version,
            batch_size=batch_size,
            dry_run=False,
            pause=0.0,
            using=using,
            on_batch=None,
        )
        for table in _tables(checkpoint_model, step_model, down_from=from_version)
    ]
    return Summary(tables=tables, seconds=time.monotonic() - started)
