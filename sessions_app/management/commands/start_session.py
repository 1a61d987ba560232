import time

from django.core.management.base import BaseCommand, CommandError

from sessions_app.models import FINAL, Status
from sessions_app.services.core import ActionError, session_start
from sessions_app.validation import command_meta

STOPPED = (*FINAL, Status.WAITING_INPUT, Status.PAUSED)


class Command(BaseCommand):
    help = "Start an agent session and queue it for a worker; prints the session id."

    def add_arguments(self, parser):
        parser.add_argument("--agent", required=True, help="agent name, e.g. demo")
        parser.add_argument("--input", required=True, help="the first user message")
        parser.add_argument("--title", default="")
        parser.add_argument("--wait", action="store_true", help="block until the session stops")
        parser.add_argument("--timeout", type=float, default=300.0, help="seconds --wait waits")

    def handle(self, *args, **options):
        try:
            session = session_start(
                agent=options["agent"],
                input=options["input"],
                title=options["title"],
                request_meta=command_meta("start_session"),
            )
        except ActionError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(str(session.id))
        if not options["wait"]:
            return
        deadline = time.monotonic() + options["timeout"]
        while True:
            session.refresh_from_db()
            if session.status in STOPPED:
                break
            if session.is_incompatible:
                # A worker refused it (its code lacks the agent, or cannot load the session)
                # and nothing will run it until a worker with other code does.
                raise CommandError(
                    f"session {session.id} is waiting for a worker that can run it: "
                    f"{session.incompatible_reason}"
                )
            if time.monotonic() > deadline:
                raise CommandError(
                    f"session {session.id} still {session.status} after {options['timeout']:g}s "
                    "(is a worker running? python manage.py rqworker)"
                )
            time.sleep(0.2)
        self.stdout.write(f"status: {session.status}")
        if session.final_answer:
            self.stdout.write(f"answer: {session.final_answer}")
        if session.last_error:
            self.stdout.write(f"error: {session.last_error}")
        if session.status == Status.FAILED:
            raise CommandError(f"session {session.id} failed")
