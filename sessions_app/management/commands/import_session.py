"""Import a session exported by export_session (from this Respawn or another)."""

from django.core.management.base import BaseCommand, CommandError

from sessions_app.upkeep.transfer import TransferError, import_session
from sessions_app.validation import command_meta


class Command(BaseCommand):
    help = (
        "Import a session export: the whole file is checked first (digest, counts, every "
        "blob through the upgraders), then written in one transaction, or nothing is."
    )

    def add_arguments(self, parser):
        parser.add_argument("file")
        parser.add_argument(
            "--new-ids",
            action="store_true",
            help="give the session a new id (to keep both, or import the same file twice)",
        )

    def handle(self, *args, **options):
        try:
            with open(options["file"], "rb") as f:
                raw = f.read()
        except OSError as exc:
            raise CommandError(f"cannot read {options['file']}: {exc.strerror}") from None
        try:
            result = import_session(
                raw, new_ids=options["new_ids"], request_meta=command_meta("import_session")
            )
        except TransferError as exc:
            raise CommandError(f"{options['file']}: {exc}") from None
        self.stdout.write(str(result.session.id))
        note = f" (was {result.remapped_from})" if result.remapped_from else ""
        self.stderr.write(
            f"imported {result.session.id}{note}: {result.steps} steps, {result.checkpoints} "
            f"checkpoints, {result.audit} imported audit records, {result.upgraded} blobs "
            f"upgraded; status {result.session.status}"
        )
