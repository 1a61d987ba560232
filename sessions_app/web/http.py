"""What the faces (the dashboard, the API, the admin) share about HTTP: the request's
metadata for audit records, what status each error code is answered with, and the parsing
of what a request carries (bearer tokens, ids, numbers). The faces parse the request, call
a selector or a service, and render; nothing here reads or writes the database."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.http import HttpRequest
from django_htmx.middleware import HtmxDetails

from ..validation import InvalidInput, parse_int
from ..validation import request_meta as request_meta  # what an audit record keeps of one


class HtmxRequest(HttpRequest):
    """A dashboard request: django-htmx's middleware tells whether htmx sent it."""

    htmx: HtmxDetails


class ApiRequest(HttpRequest):
    """An API request: `auth` is the user its bearer token named (django-ninja sets it)."""

    auth: Any


# Which face a request came through (request_meta's `via`).
DASHBOARD = "dashboard"
API = "api"
ADMIN = "admin"

# Sessions one bulk action (the dashboard's or the admin's) may name.
BULK_LIMIT = 1000

# The HTTP status every face answers an ActionError's code with; any other code is a 400.
ERROR_STATUS = {
    "not_found": 404,
    "forbidden": 403,
    "bad_status": 409,
    "already_running": 409,
    "exists": 409,
}
# The code the API names an HTTP error by when no ActionError named it.
STATUS_CODE = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found"}


def status_of(code: str) -> int:
    """The HTTP status of an error code (services.ActionError.code)."""
    return ERROR_STATUS.get(code, 400)


def code_of(status: int) -> str:
    """The error code of an HTTP status the API answers without an ActionError."""
    return STATUS_CODE.get(status, "error")


def bearer_token(request: HttpRequest) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def parse_uuid(raw: str | None) -> UUID | None:
    """An id as typed or linked (surrounding blanks allowed), or None."""
    try:
        return UUID((raw or "").strip())
    except ValueError:
        return None


def positive_int(raw: str | None) -> int | None:
    """A number of up to nine ASCII digits, or None (`"²".isdigit()` is true too)."""
    try:
        return parse_int(raw or "", "number", maximum=999_999_999)
    except InvalidInput:
        return None
