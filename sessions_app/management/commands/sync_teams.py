"""Write the teams RESPAWN_TEAMS declares into the database (migrate does too, after it
migrates; this command is for a change without a migrate)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from sessions_app.services.teams import teams_sync


class Command(BaseCommand):
    help = "Create or update the teams RESPAWN_TEAMS declares: their agents and members."

    def handle(self, *args: Any, **options: Any) -> None:
        done = teams_sync(getattr(settings, "RESPAWN_TEAMS", {}) or {})
        for problem in done.problems:
            self.stderr.write(problem)
        self.stdout.write(
            f"teams: {', '.join(done.teams) or 'none declared'}; "
            f"{done.agents} agent(s), {done.members} member(s)"
        )
        if done.problems:
            raise CommandError(f"{len(done.problems)} problem(s) in RESPAWN_TEAMS")
