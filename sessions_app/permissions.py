"""Who may do what, and on which sessions: the one rule every surface (dashboard, API, admin
site, queue dashboard, services) asks.

Global roles are Django groups: viewers read every session; operators also act; admins (the
`admin` group) also act on the job queues and manage API tokens and accounts of other
users; superusers do everything. A user with no role may do nothing, whatever else their
account says (staff status, model permissions).

Teams (sessions_app.models.teams) narrow this down. A team owns agents by name; a member
holds a role in it (viewer, operator, team admin) that applies to the sessions of the
team's agents only. A global group keeps meaning "every team", so a deployment with no team
behaves as it did before teams; a person with team roles only sees and acts on the sessions
of their teams' agents, and a session whose agent no team owns is seen only by superusers
and holders of a global role.

An API token may name a team and a role: it then reads and acts on that team's sessions
only, with that role, and never with more than its user may.

A session outside someone's scope does not exist for them: every face answers it with a
404 (never a 403, which would confirm the id)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.db.models import Q

from .models.teams import OPERATING_ROLES, GlobalRole, TeamRole

VIEWER_GROUP = GlobalRole.VIEWER.value
OPERATOR_GROUP = GlobalRole.OPERATOR.value
ADMIN_GROUP = GlobalRole.ADMIN.value
ROLE_GROUPS = frozenset(GlobalRole.values)
OPERATING_GROUPS = frozenset({OPERATOR_GROUP, ADMIN_GROUP})

TEAM_VIEWER = TeamRole.VIEWER.value
TEAM_ADMIN = TeamRole.TEAM_ADMIN.value
OPERATING_TEAM_ROLES = frozenset(role.value for role in OPERATING_ROLES)


@dataclass(frozen=True)
class Scope:
    """Sessions someone may see (or change): those of `agents`, or every one (None)."""

    agents: frozenset[str] | None

    @property
    def everything(self) -> bool:
        return self.agents is None

    def allows(self, agent: str) -> bool:
        return self.agents is None or agent in self.agents

    def within(self, other: Scope) -> Scope:
        if self.agents is None:
            return other
        if other.agents is None:
            return self
        return Scope(self.agents & other.agents)

    def q(self, field: str = "agent") -> Q:
        """Rows in scope; `field` is the path to the agent's name (`session__agent` for a
        step or an audit event). Every row when the scope is everything."""
        if self.agents is None:
            return Q()
        return Q(**{f"{field}__in": sorted(self.agents)})


EVERYTHING = Scope(None)
NOTHING = Scope(frozenset())


@dataclass(frozen=True)
class Access:
    reads: bool  # has a role at all (global or in a team)
    acts: bool  # may change some session
    view: Scope
    operate: Scope
    admin_of: frozenset[int] | None  # the teams whose tokens they manage (None: every team)


NO_ACCESS = Access(False, False, NOTHING, NOTHING, frozenset())


def _roles(user: Any) -> tuple[set[str], dict[int, str]]:
    """The user's groups, and their role in each of their teams (by team id). One query
    for both (a person has a handful of each; the join multiplies them), kept on the user
    object for the rest of the request."""
    cached = getattr(user, "_respawn_roles", None)
    if cached is None:
        rows = user._meta.default_manager.filter(pk=user.pk).values_list(
            "groups__name", "team_memberships__team_id", "team_memberships__role"
        )
        groups: set[str] = set()
        teams: dict[int, str] = {}
        for group, team_id, role in rows:
            if group is not None:
                groups.add(group)
            if team_id is not None:
                teams[team_id] = role
        cached = (groups, teams)
        user._respawn_roles = cached
    return cached


def _groups(user: Any) -> set[str]:
    return _roles(user)[0]


def _active(user: Any) -> bool:
    return bool(user and user.is_authenticated and user.is_active)


def access(user: Any) -> Access:
    """What `user` (with the API token it came with, if any) may read and change. Two small
    queries, once per request: the result is kept on the user object."""
    if not _active(user):
        return NO_ACCESS
    cached = getattr(user, "_respawn_access", None)
    if cached is None:
        cached = _access(user)
        user._respawn_access = cached
    return cached


def _access(user: Any) -> Access:
    from .models import TeamAgent

    groups, roles = _roles(user)
    token = getattr(user, "_respawn_token", None)
    teams = set(roles) | ({token.team_id} if token is not None and token.team_id else set())
    agents: dict[int, set[str]] = defaultdict(set)
    if teams:  # no team: no query (a deployment without teams reads as before them)
        for team_id, agent in TeamAgent.objects.filter(team_id__in=teams).values_list(
            "team_id", "agent"
        ):
            agents[team_id].add(agent)

    def of(team_ids: Any) -> Scope:
        return Scope(frozenset(a for t in team_ids for a in agents[t]))

    operating = [t for t, role in roles.items() if role in OPERATING_TEAM_ROLES]
    if user.is_superuser:
        reads, acts, view, operate = True, True, EVERYTHING, EVERYTHING
    else:
        reads = bool(groups & ROLE_GROUPS) or bool(roles)
        acts = bool(groups & OPERATING_GROUPS) or bool(operating)
        view = EVERYTHING if groups & ROLE_GROUPS else of(roles)
        operate = EVERYTHING if groups & OPERATING_GROUPS else of(operating)
    admin_of: frozenset[int] | None = (
        None
        if user.is_superuser or ADMIN_GROUP in groups
        else frozenset(t for t, role in roles.items() if role == TEAM_ADMIN)
    )
    if token is not None:
        # A token never manages tokens, and is never more than its user.
        admin_of = frozenset()
        if token.team_id:
            view = view.within(of([token.team_id]))
            operate = operate.within(of([token.team_id]))
            acts = acts and (
                user.is_superuser
                or bool(groups & OPERATING_GROUPS)
                or roles.get(token.team_id) in OPERATING_TEAM_ROLES
            )
        if token.role == TEAM_VIEWER:
            acts, operate = False, NOTHING
    return Access(reads, acts, view, operate if acts else NOTHING, admin_of)


def with_token(user: Any, token: Any) -> Any:
    """`user` as an API token presents them: what they may do is then the token's, within
    their own (its team, its role)."""
    user._respawn_token = token
    user.__dict__.pop("_respawn_access", None)
    return user


def can_view(user: Any) -> bool:
    """Has a role: may open the dashboard and read the sessions in their scope."""
    return access(user).reads


def can_operate(user: Any) -> bool:
    """May change some session (which ones: can_operate_session)."""
    return access(user).acts


def can_administer(user: Any) -> bool:
    """Act on the job queues; issue or revoke API tokens of other users; manage accounts."""
    if not _active(user):
        return False
    return user.is_superuser or ADMIN_GROUP in _groups(user)


def session_scope(user: Any) -> Scope:
    """The sessions `user` may read: the one filter every read of sessions goes through."""
    found = access(user)
    return found.view if found.reads else NOTHING


def operate_scope(user: Any) -> Scope:
    found = access(user)
    return found.operate if found.acts else NOTHING


def can_view_session(user: Any, session: Any) -> bool:
    return session_scope(user).allows(session.agent)


def can_operate_session(user: Any, session: Any) -> bool:
    return can_operate(user) and operate_scope(user).allows(session.agent)


def can_operate_agent(user: Any, agent: str) -> bool:
    """May start (or import) a session of `agent`."""
    return can_operate(user) and operate_scope(user).allows(agent)


def operators_of_agent_q(agent: str) -> Q:
    """The users who may act on `agent`'s sessions, as a filter on users: what
    can_operate_agent answers for one person, for everyone at once (whom a session may be
    handed to). Superusers, the operator and admin groups, and the operators and team admins
    of the team that owns the agent. Active accounts only."""
    return Q(is_active=True) & (
        Q(is_superuser=True)
        | Q(groups__name__in=sorted(OPERATING_GROUPS))
        | Q(
            team_memberships__role__in=sorted(OPERATING_TEAM_ROLES),
            team_memberships__team__agents__agent=agent,
        )
    )


def can_manage_alert_rule(user: Any, agent: str) -> bool:
    """Create, switch, test or delete an alert rule for `agent`: whoever may act on that
    agent's sessions. A rule for every agent ("") covers every team's sessions, so it takes
    a global operating role (an operate scope that is everything)."""
    if not can_operate(user):
        return False
    scope = operate_scope(user)
    return scope.everything if not agent else scope.allows(agent)


def can_manage_teams(user: Any) -> bool:
    """Opens the team page: an admin (every team) or the team admin of some team. A person
    who administers no team has nothing to do there, so is neither admitted nor shown the
    link."""
    return can_view(user) and administered_teams(user) != frozenset()


def sees_every_team(user: Any) -> bool:
    """Reads every session: what deployment-wide pages (metrics) take."""
    return can_view(user) and session_scope(user).everything


def administered_teams(user: Any) -> frozenset[int] | None:
    """The teams whose API tokens `user` lists, issues and revokes (None: every team)."""
    return access(user).admin_of
