from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import psycopg
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection
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
            policy = self._with_provider(self.policy)
            if _debug_page(response):
                # Django's own error pages under DEBUG (make run) style and script
                # themselves inline; the policy blocked that, the console said so.
                policy = re.sub(r"\b(style-src|script-src)\b", r"\1 'unsafe-inline'", policy)
            response["Content-Security-Policy"] = policy
        return response

    @staticmethod
    def _with_provider(policy: str) -> str:
        """The log-in and log-out forms lead to the single sign-on provider (browsers
        check form-action on a form's redirects too): its origins join form-action."""
        from . import sso

        origins = sso.provider_origins()
        if not origins:
            return policy
        return re.sub(
            r"(form-action [^;]*)", lambda m: " ".join([m.group(1).rstrip(), *origins]), policy
        )


def _debug_page(response: HttpResponse) -> bool:
    """A page of Django's own for an error, which only DEBUG shows (a development server:
    in production the project's own error pages are served, with no inline code)."""
    return (
        settings.DEBUG
        and response.status_code in (404, 500)
        and response.get("Content-Type", "").startswith("text/html")
    )


def database_unavailable(exc: BaseException | None) -> bool:
    """The database cannot be reached, is restarting, or has no connection to spare: as
    Django raises it, or as the driver does for a statement made on its connection
    directly (psycopg's own classes)."""
    return isinstance(
        exc,
        OperationalError | InterfaceError | psycopg.OperationalError | psycopg.InterfaceError,
    )


# Why the database did not answer, by the SQLSTATE PostgreSQL gave (else: unreachable, or
# no connection to spare): (title, what happened), told to the client as it is.
_REASONS = {
    "57014": (
        "The database took too long",
        "the database is up but a statement of this request ran past its time limit",
    ),
    "55P03": (
        "The data is busy",
        "the database is up but what this request needs is locked by another transaction",
    ),
    "57P01": ("The database is restarting", "the database is restarting"),
}
_UNREACHABLE = (
    "The database is unavailable",
    "the database is unavailable (it may be restarting, or out of connections)",
)


def _reason(exc: BaseException | None) -> tuple[str, str]:
    while exc is not None:
        state = getattr(exc, "sqlstate", None)
        if state in _REASONS:
            return _REASONS[state]
        exc = exc.__cause__
    return _UNREACHABLE


def unavailable_response(request: HttpRequest, exc: BaseException | None = None) -> HttpResponse:
    """503 with Retry-After: JSON under /api/, the styled page elsewhere, saying what
    happened (`exc`: the database error met). Renders nothing that needs the database (no
    user, no session)."""
    title, what = _reason(exc)
    if request.path.startswith("/api/"):
        response: HttpResponse = JsonResponse(
            {"error": "unavailable", "detail": f"{what}; nothing was changed, try again shortly"},
            status=503,
        )
    else:
        context = {"retry": RETRY_AFTER, "title": title, "what": what}
        response = render(request, "503.html", status=503, context=context)
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
            return unavailable_response(request, exception)
        return None


class LockWaitMiddleware:
    """A request waits at most RESPAWN_LOCK_WAIT seconds for a lock (a table a migration or
    a maintenance command holds, a row a worker holds), then answers 503 saying so (and
    frees its web thread), instead of hanging for as long as the lock is held.

    PostgreSQL's lock_timeout, set on the request's connection before its first query and
    reset after it (a pooled connection goes back as it came). Not behind a transaction-mode
    pooler (RESPAWN_POOLER_SAFE), where nothing may be set on a server connection: set
    lock_timeout on the database role there."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.wait = f"{max(1, round(settings.RESPAWN_LOCK_WAIT * 1000))}ms"

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if connection.vendor != "postgresql" or settings.RESPAWN_POOLER_SAFE:
            return self.get_response(request)
        bounded = False

        def bound(execute: Callable, sql: str, params: Any, many: bool, context: dict) -> Any:
            nonlocal bounded
            if not bounded:
                bounded = True
                # On the connection itself (psycopg's), under the query the request makes:
                # the first statement to meet a connection the database dropped (a
                # failover, a restart), so its error is made Django's as a query's is (a
                # 503, and the connection is marked unusable and not used again).
                db = context["connection"]
                with db.wrap_database_errors:
                    db.connection.execute(
                        "SELECT set_config('lock_timeout', %s, false)", [self.wait]
                    )
            return execute(sql, params, many, context)

        try:
            with connection.execute_wrapper(bound):
                return self.get_response(request)
        finally:
            if bounded and connection.connection is not None:
                try:
                    connection.connection.execute("RESET lock_timeout")
                except Exception:  # noqa: BLE001 - a broken connection is not reused
                    pass
