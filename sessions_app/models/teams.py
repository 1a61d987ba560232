"""Teams: who may see and act on whose sessions. A team owns agents (by name); a person
holds a role in a team. Which sessions a person may read or change follows from these rows
and the global groups, in one place: sessions_app.permissions."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from ..redaction import ScrubbedCharField


class TeamRole(models.TextChoices):
    VIEWER = "viewer", "viewer (reads the team's sessions)"
    OPERATOR = "operator", "operator (also acts on them)"
    TEAM_ADMIN = "team_admin", "team admin (also manages the team's API tokens)"


# The team roles that may change the team's sessions (a team admin also manages its tokens).
OPERATING_ROLES = frozenset({TeamRole.OPERATOR, TeamRole.TEAM_ADMIN})


class GlobalRole(models.TextChoices):
    """The roles over every team's sessions: Django groups of these names (made by the
    migrations). sessions_app.permissions says what each may do."""

    VIEWER = "viewer", "viewer (reads every session)"
    OPERATOR = "operator", "operator (also acts on them)"
    ADMIN = "admin", "admin (also the job queues, API tokens and accounts of others)"


class Team(models.Model):
    name = ScrubbedCharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=50, unique=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class TeamAgent(models.Model):
    """An agent a team owns, by name: its sessions are the team's. An agent belongs to one
    team at most (a session has one team to answer to); an agent no team owns is seen only
    by superusers and holders of a global role."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="agents")
    agent = models.CharField(max_length=100, unique=True)

    class Meta:
        ordering = ["agent"]

    def __str__(self) -> str:
        return f"{self.agent} ({self.team})"


class Membership(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="team_memberships"
    )
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=20, choices=TeamRole.choices, default=TeamRole.VIEWER)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "team"], name="membership_one_role_per_team")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.team}: {self.role}"
