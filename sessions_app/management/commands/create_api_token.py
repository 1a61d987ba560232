from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from sessions_app.services.records import api_token_issue
from sessions_app.validation import command_meta


class Command(BaseCommand):
    help = "Create an API token for USER and print it (it is shown this once; only a hash is kept)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="what the token is for")

    def handle(self, *args, **options):
        User = get_user_model()
        try:
            user = User.objects.get(username=options["username"])
        except User.DoesNotExist:
            raise CommandError(f"no user named {options['username']!r}") from None
        # Audited like a token an admin issues in the admin site (the secret is not kept).
        _, raw = api_token_issue(
            user=user, name=options["name"], request_meta=command_meta("create_api_token")
        )
        self.stdout.write(raw)
