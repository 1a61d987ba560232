"""Reads about teams: the teams a person administers, with their agents, members and API
tokens (what the team page lists)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Prefetch

from ..models import ApiToken, Membership, Team
from ..permissions import administered_teams

TOKENS_SHOWN = 200  # per team, newest first


@dataclass(frozen=True)
class TeamView:
    team: Team
    agents: list[str]
    members: list[Membership]
    tokens: list[ApiToken]


def administered(user: Any) -> list[TeamView]:
    """The teams whose tokens `user` manages (every team for a superuser or an admin)."""
    ids = administered_teams(user)
    # Four queries whatever the number of teams (an admin sees them all): the teams, then
    # their agents, members and newest tokens, each for every team at once.
    teams = Team.objects.prefetch_related(
        "agents",
        Prefetch(
            "memberships",
            Membership.objects.select_related("user").order_by("user__username"),
            to_attr="members_shown",
        ),
        Prefetch(
            "api_tokens",
            ApiToken.objects.select_related("user").order_by("-created_at")[:TOKENS_SHOWN],
            to_attr="tokens_shown",
        ),
    ).order_by("name")
    if ids is not None:
        teams = teams.filter(pk__in=ids)
    return [
        TeamView(team, [a.agent for a in team.agents.all()], team.members_shown, team.tokens_shown)
        for team in teams
    ]


def administered_team(user: Any, team_id: int) -> Team | None:
    """The team, if `user` administers it; None otherwise (whether it exists or not)."""
    ids = administered_teams(user)
    if ids is not None and team_id not in ids:
        return None
    return Team.objects.filter(pk=team_id).first()
