from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from sessions_app.models import Team
from sessions_app.services.core import ActionError
from sessions_app.services.records import api_token_issue
from sessions_app.services.teams import team_token_issue
from sessions_app.validation import command_meta


class Command(BaseCommand):
    help = "Create an API token for USER and print it (it is shown this once; only a hash is kept)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="what the token is for")
        parser.add_argument(
            "--team", help="a team token: reads and acts on this team's sessions only (slug)"
        )
        parser.add_argument(
            "--role",
            default="viewer",
            help="a team token's role: viewer, operator or team_admin (default viewer)",
        )
        parser.add_argument(
            "--days", type=int, default=90, help="a team token expires after (default 90)"
        )

    def handle(self, *args, **options):
        User = get_user_model()
        try:
            user = User.objects.get(username=options["username"])
        except User.DoesNotExist:
            raise CommandError(f"no user named {options['username']!r}") from None
        if options["team"]:
            team = Team.objects.filter(slug=options["team"]).first()
            if team is None:
                raise CommandError(f"no team {options['team']!r}")
            try:
                _, raw = team_token_issue(
                    team=team,
                    user=user,
                    role=options["role"],
                    name=options["name"],
                    days=options["days"],
                    request_meta=command_meta("create_api_token"),
                )
            except ActionError as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(raw)
            return
        # Audited like a token an admin issues in the admin site (the secret is not kept).
        try:
            _, raw = api_token_issue(
                user=user, name=options["name"], request_meta=command_meta("create_api_token")
            )
        except ActionError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(raw)
