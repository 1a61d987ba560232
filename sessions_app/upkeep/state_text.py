"""Checkpoint states from jsonb to compact JSON text (`json`) on PostgreSQL, in batches,
without a long lock (migration 0028; `python -m bench.state_text` times it on a copy).

`ALTER COLUMN ... TYPE json` would rewrite the whole table under an ACCESS EXCLUSIVE lock:
every worker's append (which writes a checkpoint at each turn) would wait for it, minutes
on a large table. Instead:

1. a column `state_text json` is added (a catalog change), and a trigger keeps it equal to
   `state` on every row written from then on;
2. the rows before it are filled in batches of `batch` rows, each its own short
   transaction (`WHERE state_text IS NULL`, so a row a writer changed meanwhile keeps the
   trigger's value);
3. a `CHECK (state_text IS NOT NULL)` is added NOT VALID and validated (a scan that blocks
   no writer);
4. one short transaction swaps the columns: the trigger dropped, `state` renamed away and
   dropped, `state_text` renamed to `state` and made NOT NULL (the validated check spares
   that a scan). Catalog changes only: milliseconds under its lock.

The text is exact: jsonb's own text of the value with the blanks outside strings removed
(`COMPACT`), so numbers keep every digit and strings every character. Running it again
after it finished does nothing; after an interruption it goes on from where it stopped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connections

TABLE = "sessions_app_checkpoint"
TRIGGER = "checkpoint_state_text"
FUNCTION = "respawn_checkpoint_state_text"
CHECK = "checkpoint_state_text_nn"
# jsonb's text without the blanks after separators: every run of blanks outside a string
# removed (a string, escapes and all, is kept as it is by the first alternative).
COMPACT = r"""regexp_replace({value}::text, '("(?:[^"\\]|\\.)*")|\s+', '\1', 'g')::json"""
# A waiting ALTER TABLE queues every writer behind it: each DDL statement gives up after
# this long and is tried again, rather than hold the appends up.
LOCK_WAIT = "2s"
# Rows per batch (a transaction each) when the migration runs it.
BATCH = 5000


@dataclass
class Converted:
    rows: int = 0
    batches: int = 0
    seconds: float = 0.0
    swap_ms: float = 0.0
    already: bool = False


LAST: Converted | None = None  # the last conversion of this process (bench.state_text)


def column_type(using: str = "default") -> str | None:
    with connections[using].cursor() as cursor:
        cursor.execute(
            "SELECT data_type FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND table_name = %s AND column_name = 'state'",
            [TABLE],
        )
        row = cursor.fetchone()
    return row[0] if row else None


def convert(
    *,
    using: str = "default",
    batch: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> Converted:
    """Convert the states (see the module's docstring). Runs outside any transaction:
    each batch and each step commits on its own."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return Converted(already=True)
    if connection.in_atomic_block:
        raise RuntimeError("the state conversion commits batch by batch: not in a transaction")
    global LAST
    say = progress or (lambda _text: None)
    batch = batch or BATCH
    done = LAST = Converted()
    if column_type(using) == "json":
        done.already = True
        return done
    started = time.perf_counter()
    compact_new = COMPACT.format(value="NEW.state")
    _ddl(
        using,
        f"ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS state_text json",
        f"CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS"
        f" $$ BEGIN NEW.state_text := {compact_new}; RETURN NEW; END $$",
        f"DROP TRIGGER IF EXISTS {TRIGGER} ON {TABLE}",
        f"CREATE TRIGGER {TRIGGER} BEFORE INSERT OR UPDATE OF state ON {TABLE}"
        f" FOR EACH ROW EXECUTE FUNCTION {FUNCTION}()",
    )
    say("new rows get their text from the trigger; filling the rows before it")
    last = 0
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                f"WITH todo AS (SELECT id FROM {TABLE} WHERE id > %s AND state_text IS NULL"
                " ORDER BY id LIMIT %s),"
                f" done AS (UPDATE {TABLE} c SET state_text = {COMPACT.format(value='c.state')}"
                " FROM todo WHERE c.id = todo.id AND c.state_text IS NULL RETURNING c.id)"
                " SELECT (SELECT max(id) FROM todo), (SELECT count(*) FROM done)",
                [last, batch],
            )
            highest, updated = cursor.fetchone()
        if highest is None:
            break
        last = highest
        done.rows += updated
        done.batches += 1
        if done.batches % 20 == 0:
            say(f"{done.rows:,} rows in {done.batches} batches")
    _ddl(
        using,
        f"ALTER TABLE {TABLE} DROP CONSTRAINT IF EXISTS {CHECK}",
        f"ALTER TABLE {TABLE} ADD CONSTRAINT {CHECK} CHECK (state_text IS NOT NULL) NOT VALID",
    )
    say("checking every row has its text")
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {TABLE} VALIDATE CONSTRAINT {CHECK}")
    at = time.perf_counter()
    _ddl(
        using,
        f"DROP TRIGGER {TRIGGER} ON {TABLE}",
        f"ALTER TABLE {TABLE} RENAME COLUMN state TO state_jsonb",
        f"ALTER TABLE {TABLE} RENAME COLUMN state_text TO state",
        f"ALTER TABLE {TABLE} ALTER COLUMN state SET NOT NULL",
        f"ALTER TABLE {TABLE} DROP CONSTRAINT {CHECK}",
        f"ALTER TABLE {TABLE} DROP COLUMN state_jsonb",
        f"DROP FUNCTION {FUNCTION}()",
        together=True,
    )
    done.swap_ms = (time.perf_counter() - at) * 1000
    done.seconds = time.perf_counter() - started
    say(f"converted {done.rows:,} states; the swap held its lock {done.swap_ms:.0f} ms")
    return done


def back_to_jsonb(*, using: str = "default") -> None:
    """The migration's reverse: one ALTER (it rewrites the table under its lock: going back
    is for an emergency, not for a running fleet)."""
    if connections[using].vendor == "postgresql" and column_type(using) == "json":
        with connections[using].cursor() as cursor:
            cursor.execute(f"ALTER TABLE {TABLE} ALTER COLUMN state TYPE jsonb USING state::jsonb")


def _ddl(using: str, *statements: str, together: bool = False, attempts: int = 30) -> None:
    """DDL with a bounded wait for its lock, tried again until it gets it: `together`, the
    statements are one transaction (the swap); else each is its own."""
    from django.db import OperationalError, transaction

    groups = [list(statements)] if together else [[s] for s in statements]
    for group in groups:
        for attempt in range(attempts):
            try:
                with transaction.atomic(using=using), connections[using].cursor() as cursor:
                    cursor.execute("SELECT set_config('lock_timeout', %s, true)", [LOCK_WAIT])
                    for statement in group:
                        cursor.execute(statement)
                break
            except OperationalError as exc:
                if "lock timeout" not in str(exc) or attempt == attempts - 1:
                    raise
                time.sleep(0.5)
