"""Dashboard views. A plain list and trace for now; function views, login everywhere."""

from __future__ import annotations

from uuid import UUID

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from .models import AgentSession, Status
from .selectors import session_trace

PAGE_SIZE = 50


@login_required
def session_list(request: HttpRequest) -> HttpResponse:
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
    session = get_object_or_404(AgentSession, id=session_id)
    steps = session_trace(session, limit=500)
    return render(request, "sessions/detail.html", {"session": session, "steps": steps})
