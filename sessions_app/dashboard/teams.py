"""The team page: the teams a person administers, their agents and members, and their API
tokens, which a team admin issues (the secret shown this once) and revokes; each audited by
the service (sessions_app.services.teams)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from ..models import TeamRole
from ..permissions import can_manage_teams, can_view
from ..selectors import teams as selectors
from ..services import teams as services
from ..services.core import ActionError
from ..validation import InvalidInput, parse_int
from ..web.http import DASHBOARD, HtmxRequest, request_meta


def _require_team_admin(request: HtmxRequest) -> None:
    """The page is for admins and team admins (can_manage_teams, which also decides whether
    the menu links here): anyone else would find nothing to do on it."""
    if not can_view(request.user):
        raise PermissionDenied("your account has no role here (viewer or operator)")
    if not can_manage_teams(request.user):
        raise PermissionDenied("the team page is for team admins (and admins)")


def _context(request: HtmxRequest, **extra: Any) -> dict[str, Any]:
    return {
        "teams": selectors.administered(request.user),
        "roles": TeamRole.choices,
        "max_days": services.MAX_TOKEN_DAYS,
        **extra,
    }


@login_required
@require_http_methods(["GET", "POST"])
def teams(request: HtmxRequest) -> HttpResponse:
    """The teams the user administers, and the form that issues a team token."""
    _require_team_admin(request)
    if request.method == "GET":
        return render(request, "sessions/teams.html", _context(request))
    try:
        team_id = parse_int(request.POST.get("team", ""), "team", minimum=1)
        days = parse_int(request.POST.get("days", "90"), "days", minimum=1)
    except InvalidInput as exc:
        return render(request, "sessions/teams.html", _context(request, error=str(exc)), status=400)
    team = selectors.administered_team(request.user, team_id)
    if team is None:
        raise Http404("no such team")
    user = get_user_model().objects.filter(username=request.POST.get("user", "")[:150]).first()
    try:
        if user is None:
            raise ActionError("choose a member of the team", field="user")
        token, secret = services.team_token_issue(
            team=team,
            user=user,
            role=request.POST.get("role", ""),
            name=request.POST.get("name", ""),
            days=days,
            actor=request.user,
            request_meta=request_meta(request, DASHBOARD),
        )
    except ActionError as exc:
        context = _context(request, error=str(exc))
        return render(request, "sessions/teams.html", context, status=exc.status)
    context = _context(request, issued=token, secret=secret)
    return render(request, "sessions/teams.html", context, status=201)


@login_required
@require_POST
def team_token_revoke(request: HtmxRequest, token_id: int) -> HttpResponse:
    _require_team_admin(request)
    try:
        token = services.team_token_revoke(
            token_id=token_id, actor=request.user, request_meta=request_meta(request, DASHBOARD)
        )
    except ActionError as exc:
        if exc.status == 404:
            raise Http404(str(exc)) from None
        messages.error(request, str(exc))
        return redirect("sessions:teams")
    messages.success(request, f"Revoked the token {token.key_prefix}… of {token.user}.")
    return redirect("sessions:teams")
