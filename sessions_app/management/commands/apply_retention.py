"""Apply the retention policies (sessions_app.upkeep.retention) in short batches."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from sessions_app.upkeep.archive import ArchiveError
from sessions_app.upkeep.retention import (
    DEFAULT_BATCH_SIZE,
    Part,
    PolicyError,
    Summary,
    apply_retention,
    configured_policy,
    parse_policy,
)

BAR_WIDTH = 30


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


class Command(BaseCommand):
    help = (
        "Apply the retention policies: delete finished sessions past their time (archived "
        "first when an archive directory is set), thin old checkpoints, compact old "
        "superseded steps. Sessions on legal hold are never touched, the audit log never "
        "pruned. One short transaction per session; safe to interrupt and run again."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="count what would go, and its size; delete nothing",
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=DEFAULT_BATCH_SIZE,
            help=f"sessions per batch (default {DEFAULT_BATCH_SIZE})",
        )
        parser.add_argument(
            "--pause", type=float, default=0.0, help="seconds between batches (default 0)"
        )
        parser.add_argument(
            "--policy", help="a policy (JSON) to apply instead of the configured one"
        )

    def handle(self, *args, **options):
        if options["batch_size"] < 1:
            raise CommandError(f"--batch-size must be at least 1, got {options['batch_size']}")
        if options["pause"] < 0:
            raise CommandError(f"--pause must not be negative, got {options['pause']:g}")
        try:
            policy = (
                parse_policy(json.loads(options["policy"]))
                if options["policy"]
                else configured_policy()
            )
        except ValueError as exc:  # PolicyError or bad JSON
            kind = "" if isinstance(exc, PolicyError) else "not JSON: "
            raise CommandError(f"the retention policy is {kind}{exc}") from None
        if policy.empty:
            self.stdout.write(
                "no retention policy is configured (RESPAWN_RETENTION): nothing to do"
            )
            return
        archive = policy.archive
        problem = archive.problem() if archive is not None else None
        if problem:
            raise CommandError(f"the retention policy's archive: {problem}")
        self._drawn: tuple[str, int] | None = None
        try:
            summary = apply_retention(
                policy,
                dry_run=options["dry_run"],
                batch_size=options["batch_size"],
                pause=options["pause"],
                progress=self.progress,
            )
        except ArchiveError as exc:
            self.finish_bar()
            raise CommandError(
                f"archiving failed, so the batch it was for was not deleted: {exc} "
                "(what earlier batches archived and deleted stays done; run it again)"
            ) from None
        self.finish_bar()
        self.write_summary(summary)

    def progress(self, what: str, done: int, total: int) -> None:
        percent = 100 if not total else done * 100 // total
        if self._drawn is not None and self._drawn[0] != what:
            self.finish_bar()
        if self._drawn == (what, percent):
            return
        filled = BAR_WIDTH * percent // 100
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        self.stderr.write(f"\r{what:<18}[{bar}] {percent:3d}% {done}/{total}", ending="")
        self.stderr.flush()
        self._drawn = (what, percent)

    def finish_bar(self) -> None:
        if self._drawn is not None:
            self.stderr.write("")
            self._drawn = None

    def write_summary(self, summary: Summary) -> None:
        verb = "would delete" if summary.dry_run else "deleted"
        lines: list[tuple[str, Part, str]] = [
            ("finished sessions", summary.deleted_sessions, "steps and checkpoints"),
            ("old checkpoints", summary.checkpoints, "checkpoints"),
            ("superseded steps", summary.superseded_steps, "steps"),
        ]
        for title, part, rows in lines:
            held = f"; {part.held} on legal hold, left alone" if part.held else ""
            self.stdout.write(
                f"{title + ':':<19}{verb} {part.rows} {rows} of {part.sessions} session(s), "
                f"{_size(part.bytes)}{held}"
            )
        if summary.archived:
            self.stdout.write(f"archived {len(summary.archived)} export file(s) first")
        if summary.dry_run:
            self.stdout.write(
                f"dry run: nothing was deleted; {_size(summary.bytes)} of row data would be "
                f"freed ({summary.seconds:.2f}s)"
            )
        else:
            self.stdout.write(
                f"freed {_size(summary.bytes)} of row data in {summary.seconds:.2f}s "
                f"(longest transaction {summary.longest_transaction * 1000:.0f} ms)"
            )
