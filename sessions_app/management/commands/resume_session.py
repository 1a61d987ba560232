import uuid

from django.core.management.base import BaseCommand, CommandError

from sessions_app.services.core import ActionError, session_resume
from sessions_app.validation import command_meta


class Command(BaseCommand):
    help = "Queue a paused, failed or stuck session to continue from its last checkpoint."

    def add_arguments(self, parser):
        parser.add_argument("session_id")

    def handle(self, *args, **options):
        raw = options["session_id"]
        try:
            session_id = uuid.UUID(raw)
        except ValueError:
            raise CommandError(f"not a session id (expected a UUID): {raw!r}") from None
        try:
            session = session_resume(
                session_id=session_id, request_meta=command_meta("resume_session")
            )
        except ActionError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"{session.id} queued")
