"""Export one session to a file (gzip-compressed JSON lines; sessions_app.upkeep.transfer)."""

import sys
import uuid

from django.core.management.base import BaseCommand, CommandError

from sessions_app.models import AgentSession
from sessions_app.upkeep.transfer import export_session
from sessions_app.validation import command_meta


class Command(BaseCommand):
    help = (
        "Write one session (every step, superseded ones included, its checkpoints and audit "
        "records, with their schema versions) to a file that import_session reads."
    )

    def add_arguments(self, parser):
        parser.add_argument("session_id")
        parser.add_argument(
            "-o", "--output", required=True, help="the file to write (- for standard output)"
        )

    def handle(self, *args, **options):
        try:
            session = AgentSession.objects.get(id=uuid.UUID(options["session_id"]))
        except (ValueError, AgentSession.DoesNotExist):
            raise CommandError(f"no session with id {options['session_id']}") from None
        target = options["output"]
        meta = command_meta("export_session")
        if target == "-":
            counts = export_session(session, sys.stdout.buffer, request_meta=meta)
            return
        try:
            with open(target, "wb") as out:
                counts = export_session(session, out, request_meta=meta)
        except OSError as exc:
            raise CommandError(f"cannot write {target}: {exc.strerror}") from None
        self.stderr.write(
            f"exported {session.id}: {counts['step']} steps, {counts['checkpoint']} checkpoints, "
            f"{counts['audit']} audit records -> {target}"
        )
