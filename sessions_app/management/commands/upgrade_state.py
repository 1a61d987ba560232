"""Rewrite stored blobs to the current schema version, on demand (as migration
0009_upgrade_state_blobs does)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from agent_runtime.state import SCHEMA_VERSION
from agent_runtime.upgraders import IncompatibleSchemaError
from sessions_app.models import AgentSession, Checkpoint, Step
from sessions_app.services.core import session_clear_incompatible
from sessions_app.store import session_store
from sessions_app.upkeep.state_upgrade import (
    DEFAULT_BATCH_SIZE,
    Summary,
    TableSummary,
    upgrade_blobs,
)

BAR_WIDTH = 30


def unapplied_migrations() -> list[str]:
    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return [f"{migration.app_label}.{migration.name}" for migration, _ in plan]


class Command(BaseCommand):
    help = (
        f"Rewrite every checkpoint state and step payload stored in an older schema version to "
        f"version {SCHEMA_VERSION}, in batches (one short transaction each). Safe to interrupt "
        "and to run again; blobs this code cannot load are refused and left untouched."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--dry-run", action="store_true", help="read and convert, write nothing"
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=DEFAULT_BATCH_SIZE,
            help=f"rows per transaction (default {DEFAULT_BATCH_SIZE})",
        )
        parser.add_argument(
            "--pause",
            type=float,
            default=0.0,
            help="seconds to wait between batches, to spare a busy database (default 0)",
        )

    def handle(self, *args, **options):
        batch_size = options["batch_size"]
        if batch_size < 1:
            raise CommandError(f"--batch-size must be at least 1, got {batch_size}")
        if options["pause"] < 0:
            raise CommandError(f"--pause must not be negative, got {options['pause']:g}")
        pending = unapplied_migrations()
        if pending:
            # Before `migrate`, the previous release's workers still serve this database:
            # rewriting blobs to a version they cannot read would stall their sessions.
            raise CommandError(
                f"unapplied migrations ({', '.join(pending)}): run `manage.py migrate` first "
                "(its data migrations do this upgrade themselves)"
            )
        self._drawn: tuple[str, int] | None = None
        summary = upgrade_blobs(
            Checkpoint,
            Step,
            batch_size=batch_size,
            dry_run=options["dry_run"],
            pause=options["pause"],
            on_batch=self.progress,
        )
        self.finish_bar()
        self.write_summary(summary)
        self.clear_marks(dry_run=options["dry_run"])

    # -- the progress bar (stderr) -------------------------------------------------------
    def progress(self, table: TableSummary) -> None:
        done = min(table.read, table.total)
        percent = 100 if not table.total else done * 100 // table.total
        if self._drawn is not None and self._drawn[0] != table.table:
            self.finish_bar()
        if self._drawn == (table.table, percent):
            return  # redraw once per percent, so a log file gets at most 101 updates
        filled = BAR_WIDTH * percent // 100
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        self.stderr.write(
            f"\r{table.table:<12}[{bar}] {percent:3d}% {done}/{table.total}", ending=""
        )
        self.stderr.flush()
        self._drawn = (table.table, percent)

    def finish_bar(self) -> None:
        if self._drawn is not None:
            self.stderr.write("")
            self._drawn = None

    # -- the summary (stdout) ------------------------------------------------------------
    def write_summary(self, summary: Summary) -> None:
        upgraded = "would upgrade" if summary.dry_run else "upgraded"
        for t in summary.tables:
            self.stdout.write(
                f"{t.table + ':':<13}read {t.read}, {upgraded} {t.upgraded}, "
                f"already current {t.current}, refused {t.refused}"
            )
        refusals = [r for t in summary.tables for r in t.refusals]
        if refusals:
            self.stdout.write("refused (left as they are):")
            for r in refusals:
                what = "checkpoint" if r.table == "checkpoints" else "step"
                self.stdout.write(f"  {what} seq {r.seq} of session {r.session_id}: {r.error}")
            if summary.refused > len(refusals):
                self.stdout.write(f"  ... and {summary.refused - len(refusals)} more")
        if summary.dry_run:
            self.stdout.write(f"dry run: nothing was written ({summary.seconds:.2f}s)")
        else:
            self.stdout.write(
                f"upgraded {summary.upgraded} blob(s) to schema version {SCHEMA_VERSION} "
                f"in {summary.seconds:.2f}s"
            )

    def clear_marks(self, *, dry_run: bool) -> None:
        """Sessions marked incompatible that load now get their mark cleared, so the
        reconciler dispatches them again."""
        store = session_store()
        cleared = []
        for session_id in AgentSession.objects.filter(incompatible_at__isnull=False).values_list(
            "id", flat=True
        ):
            try:
                store.load_head(str(session_id))
            except IncompatibleSchemaError:
                continue
            if dry_run or session_clear_incompatible(session_id=session_id):
                cleared.append(str(session_id))
        if cleared:
            verb = "would clear" if dry_run else "cleared"
            self.stdout.write(
                f"{verb} the incompatible mark of {len(cleared)} session(s) that load now: "
                + ", ".join(cleared)
            )
