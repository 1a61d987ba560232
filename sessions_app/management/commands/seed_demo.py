"""Demo users and a handful of real sessions in every status, run through the engine.

Outside production the demo accounts get the passwords the README lists (admin/admin,
operator/operator, viewer/viewer). In production mode the command refuses unless forced,
and then sets generated passwords; either way it prints what it set."""

import secrets
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from agent_runtime.loop import run_session
from agent_runtime.providers import ProviderError
from agent_runtime.state import NewStep, StepKind, model_payload
from sessions_app.models import AgentSession, Status
from sessions_app.runtime import agent_registry, run_config
from sessions_app.services.core import checkpoint_rollback, session_cancel, session_start
from sessions_app.store import DjangoEffects, session_store, writes
from sessions_app.validation import command_meta

DEMO_USERS = [
    # username, password (outside production), group, superuser, what it may do
    ("admin", "admin", None, True, "everything, and /admin/"),
    ("operator", "operator", "operator", False, "read and act on sessions"),
    ("viewer", "viewer", "viewer", False, "read only"),
]


class _RevokedKeyProvider:
    def complete(self, messages, tools, settings):
        raise ProviderError("401 Unauthorized: the API key was revoked", permanent=True, status=401)


class Command(BaseCommand):
    help = (
        "Create the demo users and sessions in every status (skipped if sessions exist). "
        "Refuses in production mode unless --force."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--force",
            action="store_true",
            help="run in production mode too (the accounts get generated passwords), and add "
            "the sessions again when some exist",
        )

    def handle(self, *args, **options):
        if settings.PRODUCTION and not options["force"]:
            raise CommandError(
                "refusing to create demo accounts in production mode: anyone who has read "
                "the README knows their passwords. Run with --force to create them with "
                "generated passwords (printed once), or create real accounts with "
                "`manage.py createsuperuser`."
            )
        self.seed_users(generated=settings.PRODUCTION)
        if AgentSession.objects.exists() and not options["force"]:
            self.stdout.write("sessions exist already; users checked (use --force to add more)")
            return
        if "demo" not in agent_registry():
            self.stdout.write(
                "the demo agents are not loaded (RESPAWN_AGENTS does not name "
                "demo_agents:agents); users checked, no demo sessions"
            )
            return
        store, effects = session_store(), DjangoEffects()
        meta = command_meta("seed_demo")

        def run(session, **kwargs):
            return run_session(
                str(session.id),
                store=store,
                agents=agent_registry(),
                effects=effects,
                config=run_config(),
                **kwargs,
            )

        completed = session_start(
            request_meta=meta, agent="demo", input="what is (12*7)+3, then save it as a note"
        )
        run(completed)
        run(session_start(request_meta=meta, agent="flaky", input="check the status page"))

        waiting = session_start(
            request_meta=meta, agent="approval", input="pay invoice INV-1042 to ACME Ltd"
        )
        run(waiting)

        failed = session_start(
            request_meta=meta,
            agent="demo",
            input="what is 6*7?",
            title="demo with a revoked API key",
        )
        run(failed, make_provider=lambda spec, options: (_RevokedKeyProvider(), spec))

        paused = session_start(
            request_meta=meta, agent="demo", input="what is 2**10, then save it as a note"
        )
        run(paused)
        first_boundary = paused.checkpoints.earliest("seq").seq
        checkpoint_rollback(session_id=paused.id, checkpoint_seq=first_boundary, request_meta=meta)

        cancelled = session_start(
            request_meta=meta, agent="slow", input="count to 50", title="a long count, cancelled"
        )
        session_cancel(session_id=cancelled.id, request_meta=meta)

        stuck = session_start(
            request_meta=meta,
            agent="slow",
            input="count to 4",
            title="worker crashed mid-tool-call",
        )
        self.crash_mid_call(store, stuck)

        queued = session_start(
            request_meta=meta, agent="slow", input="count to 20", title="slow count: watch it live"
        )
        self.stdout.write(
            f"seeded sessions: completed {completed.id}, waiting {waiting.id}, failed {failed.id}, "
            f"paused {paused.id}, cancelled {cancelled.id}, stuck {stuck.id}, queued {queued.id}"
        )

    def seed_users(self, *, generated: bool) -> None:
        lines = []
        for username, password, group, superuser, can in DEMO_USERS:
            user, created = User.objects.get_or_create(
                username=username, defaults={"is_staff": superuser, "is_superuser": superuser}
            )
            if created:
                if generated:
                    password = secrets.token_urlsafe(12)
                user.set_password(password)
                user.save()
                lines.append(f"  {username:<9} password {password:<18} {can}")
            else:
                lines.append(f"  {username:<9} exists already, password unchanged ({can})")
            if group:
                user.groups.add(Group.objects.get(name=group))
        self.stdout.write("demo accounts:\n" + "\n".join(lines))
        self.stdout.write(
            "change a password with: python manage.py changepassword USERNAME "
            "(or in the admin site, /admin/auth/user/)"
        )

    def crash_mid_call(self, store, session):
        """Leave a session as a SIGKILLed worker would: tool call recorded, no result, an
        expired lease. The reconciler (or a resume) brings it back."""
        lease = store.claim(str(session.id), "seed:crashed-worker", ttl=30)
        key = f"{session.id}:{session.last_seq + 3}"  # the seq the tool call step gets
        store.append(
            lease,
            [
                NewStep(
                    kind=StepKind.SYSTEM, payload={"event": "run_started", "worker": lease.owner}
                ),
                NewStep(
                    kind=StepKind.MODEL,
                    payload=model_payload(
                        "Tick 1 of 4.",
                        [{"id": "call_0_0", "name": "tick", "arguments": {"n": 1}}],
                        {"input_tokens": 4, "output_tokens": 11, "cost": 0.0},
                        "scripted:slow",
                    ),
                    tokens_in=4,
                    tokens_out=11,
                ),
                NewStep(
                    kind=StepKind.TOOL_CALL,
                    payload={
                        "call_id": "call_0_0",
                        "name": "tick",
                        "arguments": {"n": 1},
                    },
                    idempotency_key=key,
                ),
            ],
        )
        AgentSession.objects.filter(id=session.id).update(
            status=Status.RUNNING, dispatched_at=timezone.now() - timedelta(minutes=6)
        )
        writes.expire_lease(session.id, ago=timedelta(minutes=5))
