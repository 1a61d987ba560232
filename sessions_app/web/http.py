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
    "busy": 409,
    "owner_changed": 409,  # the work queue: someone took or handed the session meanwhile
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


# The fewest hex digits of a session id the audit log looks a session up by.
MIN_ID_PREFIX = 4


def parse_uuid_prefix(raw: str) -> tuple[UUID, UUID]:
    """The ids a session id, or its first MIN_ID_PREFIX or more hex digits (dashes
    anywhere), can stand for: the lowest and the highest, both included. InvalidInput
    naming the problem otherwise."""
    digits = raw.strip().replace("-", "").lower()
    if len(digits) > 32 or not digits or any(c not in "0123456789abcdef" for c in digits):
        raise InvalidInput(
            "session", f"{raw[:60]!r} is not a session id or the start of one (0-9, a-f)"
        )
    if len(digits) < MIN_ID_PREFIX:
        raise InvalidInput(
            "session",
            f"{raw[:60]!r} is too short: give at least {MIN_ID_PREFIX} hex digits of a session id",
        )
    return UUID(digits.ljust(32, "0")), UUID(digits.ljust(32, "f"))


def positive_int(raw: str | None) -> int | None:
    """A number of up to nine ASCII digits, or None (`"²".isdigit()` is true too)."""
    try:
        return parse_int(raw or "", "number", maximum=999_999_999)
    except InvalidInput:
        return None
