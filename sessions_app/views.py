"""Dashboard views. A plain list and trace for now; function views, login everywhere."""

from __future__ import annotations

from uuid import UUID

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from .models import AgentSession, Status
from .permissions import can_view

PAGE_SIZE = 50


def _require_view(request: HttpRequest) -> None:
    if not can_view(request.user):
        raise PermissionDenied("your account has no role here (viewer or operator)")


@login_required
def session_list(request: HttpRequest) -> HttpResponse:
    _require_view(request)
    sessions = AgentSession.objects.order_by("-updated_at", "id")
    status = request.GET.get("status", "")
    if status in Status.values:
        sessions = sessions.filter(status=status)
    return render(
        request,
        "sessions/list.html",
        {"sessions": list(sessions[:PAGE_SIZE]), "statuses": Status.choices, "status": status},
    )


@login_required
def session_detail(request: HttpRequest, session_id: UUID) -> HttpResponse:
    _require_view(request)
    session = get_object_or_404(AgentSession, id=session_id)
    steps = session.steps.order_by("seq")[:500]
    return render(request, "sessions/detail.html", {"session": session, "steps": steps})
