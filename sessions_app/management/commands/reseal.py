"""Encrypt every sealed value again under the current key (RESPAWN_SEAL_KEYS' first)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from sessions_app.sealing import SealError, current_key_id
from sessions_app.store.reseal import reseal


class Command(BaseCommand):
    help = (
        "Re-encrypt every sealed value (the secrets in what runs read back) under the first "
        "of RESPAWN_SEAL_KEYS. Put the new key first, keep the old ones after it, run this, "
        "then drop the old ones. Safe to interrupt and to run again."
    )

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true", help="count, write nothing")
        parser.add_argument("--batch-size", type=int, default=500)

    def handle(self, *args, dry_run: bool = False, batch_size: int = 500, **options):
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1")
        try:
            counts = reseal(batch=batch_size, dry_run=dry_run)
        except SealError as exc:
            raise CommandError(str(exc)) from None
        verb = "would re-encrypt" if dry_run else "re-encrypted"
        for label, count in counts.items():
            if count:
                self.stdout.write(f"{label}: {verb} {count}")
        total = sum(counts.values())
        self.stdout.write(f"{verb} {total} value(s); all sealed under key {current_key_id()}")
