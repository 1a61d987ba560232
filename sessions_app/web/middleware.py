from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

# What a client is told to wait before trying again while the database is unavailable.
RETRY_AFTER = 5


class ContentSecurityPolicyMiddleware:
    """Sets the Content-Security-Policy header on every response that has none."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.policy = settings.RESPAWN_CSP

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if self.policy and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = self.policy
        return response


def database_unavailable(exc: BaseException | None) -> bool:
    """The database cannot be reached, is restarting, or has no connection to spare."""
    return isinstance(exc, OperationalError | InterfaceError)


def unavailable_response(request: HttpRequest) -> HttpResponse:
    """503 with Retry-After: JSON under /api/, the styled page elsewhere. Renders nothing
    that needs the database (no user, no session)."""
    if request.path.startswith("/api/"):
        response: HttpResponse = JsonResponse(
            {
                "error": "unavailable",
                "detail": "the database is unavailable; nothing was changed, try again shortly",
            },
            status=503,
        )
    else:
        response = render(request, "503.html", status=503, context={"retry": RETRY_AFTER})
    response["Retry-After"] = str(RETRY_AFTER)
    return response


class DatabaseUnavailableMiddleware:
    """Turns a database outage met by a view into a quick 503 instead of a 500 (the
    connection wait is bounded by RESPAWN_DB_WAIT); the error handler does the same for
    one met elsewhere in the request (sessions_app.dashboard.views.server_error)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if database_unavailable(exception):
            return unavailable_response(request)
        return None
