"""Teams: their API tokens, issued and revoked by the team's admins (audited like every
operator action), and the teams declared in settings (RESPAWN_TEAMS) written into the
tables the admin edits."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone
from django.utils.text import slugify

from ..models import ApiToken, AuditAction, Membership, Team, TeamAgent, TeamRole
from ..permissions import administered_teams
from .core import ActionError, Actor, ActorInfo, _actor, audit
from .records import revoke_token, token_name

MAX_TOKEN_DAYS = 366  # a team token expires, at the latest a year after it is issued


def _administered(actor: Any) -> frozenset[int] | None:
    """The teams `actor` manages the tokens of; every team for the system (a command)."""
    return administered_teams(actor) if actor is not None else None


def _refuse_unless_team_admin(actor: Any, team: Team) -> None:
    teams = _administered(actor)
    if teams is not None and team.pk not in teams:
        raise ActionError(f"only {team.name}'s team admins manage its API tokens", code="forbidden")


def team_token_issue(
    *,
    team: Team,
    user: Any,
    role: str,
    name: str = "",
    days: int = 90,
    actor: Actor = None,
    request_meta: dict | None = None,
) -> tuple[ApiToken, str]:
    """A token for a member of `team`, acting on the team's sessions only with `role` (and
    never more than the member may), expiring after `days`. Returns it with the secret,
    which is stored nowhere (not in the token row, not in the audit event)."""
    who = _actor(actor)
    _refuse_unless_team_admin(who.user, team)
    if role not in TeamRole.values:
        raise ActionError(
            f"unknown role {role!r} (one of {', '.join(TeamRole.values)})", field="role"
        )
    if not 1 <= days <= MAX_TOKEN_DAYS:
        raise ActionError(f"days: from 1 to {MAX_TOKEN_DAYS}", field="days")
    if not Membership.objects.filter(team=team, user=user).exists():
        raise ActionError(f"{user.get_username()} is not a member of {team.name}", field="user")
    expires_at = timezone.now() + timedelta(days=days)
    with transaction.atomic():
        token, raw = ApiToken.issue(
            user, token_name(name), team=team, role=role, expires_at=expires_at
        )
        audit(
            actor=who,
            action=AuditAction.TEAM_ISSUE_TOKEN,
            session=None,
            after={
                "token": token.pk,
                "team": team.slug,
                "user": user.get_username(),
                "role": role,
                "name": token.name,
                "key_prefix": token.key_prefix,
                "expires_at": expires_at.isoformat(),
            },
            request_meta=request_meta,
        )
    return token, raw


def team_token_revoke(
    *, token_id: int, actor: Actor = None, request_meta: dict | None = None
) -> ApiToken:
    """Revoke a team's token. A token of a team the actor does not administer is "not
    found", as another team's session is."""

    def refuse_unless_team_admin(who: ActorInfo, token: ApiToken | None) -> ApiToken:
        teams = _administered(who.user)
        if (
            token is None
            or token.team_id is None
            or (teams is not None and token.team_id not in teams)
        ):
            raise ActionError(f"no team API token with id {token_id}", code="not_found")
        return token

    return revoke_token(
        token_id,
        allowed=refuse_unless_team_admin,
        action=AuditAction.TEAM_REVOKE_TOKEN,
        actor=actor,
        request_meta=request_meta,
    )


# --- Teams declared in settings ---------------------------------------------------------


@dataclass
class Synced:
    teams: list[str] = field(default_factory=list)
    agents: int = 0
    members: int = 0
    problems: list[str] = field(default_factory=list)


def sync_declared_teams_after_migrate(sender: Any, **kwargs: Any) -> None:
    """After every `migrate` (post_migrate, sessions_app.apps): the teams RESPAWN_TEAMS
    declares are written as `manage.py sync_teams` writes them, so the deploy step that
    migrates also applies a changed declaration. A member with no account yet is named on
    migrate's output and does not fail it (the account may come later; sync_teams again
    then). Nothing when no team is declared, or when the database is migrated back to
    before teams (the state migrate leaves has no Team)."""
    from django.conf import settings

    declared = getattr(settings, "RESPAWN_TEAMS", None)
    if not declared:
        return
    try:
        kwargs["apps"].get_model("sessions_app", "Team")
    except (KeyError, LookupError):
        return
    done = teams_sync(declared)
    stdout = kwargs.get("stdout")
    if stdout is not None and kwargs.get("verbosity", 1) >= 1:
        stdout.write(
            f"  Teams from RESPAWN_TEAMS: {', '.join(done.teams) or 'none'}; "
            f"{done.agents} agent(s), {done.members} member(s)"
        )
        for problem in done.problems:
            stdout.write(f"  RESPAWN_TEAMS: {problem}")


def teams_sync(declared: Any) -> Synced:
    """Write the teams RESPAWN_TEAMS declares: each team (by slug), the agents it owns (an
    agent another team owned moves to this one) and its members' roles. What the setting
    does not name is left as the admin made it: the setting adds and updates, never
    deletes. A member named who has no account is reported, not created."""
    done = Synced()
    if not isinstance(declared, dict):
        done.problems.append("RESPAWN_TEAMS must be a JSON object of teams by slug")
        return done
    users = get_user_model()
    with transaction.atomic():
        for slug, spec in declared.items():
            spec = spec if isinstance(spec, dict) else {}
            team, _ = Team.objects.update_or_create(
                slug=slugify(str(slug))[:50],
                defaults={"name": str(spec.get("name") or slug)[:100]},
            )
            done.teams.append(team.slug)
            for agent in spec.get("agents") or []:
                TeamAgent.objects.update_or_create(agent=str(agent)[:100], defaults={"team": team})
                done.agents += 1
            for username, role in (spec.get("members") or {}).items():
                user = users.objects.filter(username=username).first()
                if user is None:
                    done.problems.append(f"{slug}: no user named {username!r}")
                    continue
                if role not in TeamRole.values:
                    done.problems.append(f"{slug}: {username}: unknown role {role!r}")
                    continue
                Membership.objects.update_or_create(user=user, team=team, defaults={"role": role})
                done.members += 1
    return done
