"""Input checks at the edges (dashboard, admin, API), so that no input reaches a query, a
parser or a column it would break: a clear 400 or 422 naming the field instead of a 500.

- Text: no NUL and no other control character (C0, DEL, C1); multi-line text may hold
  tabs and line breaks. `InputGuardMiddleware` applies this to every query and form
  parameter of every request, the API's schemas to every field of a JSON body.
- Numbers: ASCII digits only, within a range (`"²".isdigit()` is true, `int("²")` fails;
  a number past 2**31 overflows a column).
- Dates: `YYYY-MM-DD` and nothing else `date.fromisoformat` would take, between MIN_DATE
  and MAX_DATE (a day after 9999-12-31 does not exist).
- JSON: its nesting depth is checked on the text before it is parsed; NaN and infinities
  are refused (PostgreSQL's jsonb has neither), and so is NUL in any string (jsonb cannot
  hold it); a request body must be an object.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Callable
from datetime import date, datetime
from typing import TYPE_CHECKING, Annotated, Any, TypeAlias, Union

from django.conf import settings
from django.core.exceptions import BadRequest, ValidationError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError
from ninja.parser import Parser
from pydantic import AfterValidator, Field, PlainValidator
from typing_extensions import TypeAliasType

from agent_runtime.state import StateError
from agent_runtime.upgraders import IncompatibleSchemaError, load_state, load_step_payload

MAX_INT = 2**31 - 1  # the range of an integer column
MIN_DATE = date(1900, 1, 1)
MAX_DATE = date(2999, 12, 31)
MAX_JSON_DEPTH = 32
MAX_USER_AGENT = 200

# C0 but tab, LF and CR; DEL; C1. As regex text: the same class serves Python's checks and
# the patterns of the OpenAPI document.
_CONTROL = r"\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f"
_BREAKS = r"\t\n\r"
_CONTROL_CHARS = re.compile(f"[{_CONTROL}]")
_CONTROL_OR_BREAK = re.compile(f"[{_CONTROL}{_BREAKS}]")
MULTILINE_PATTERN = f"^[^{_CONTROL}]*$"
SINGLE_LINE_PATTERN = f"^[^{_CONTROL}{_BREAKS}]*$"
NOT_BLANK_PATTERN = f"^[^{_CONTROL}]*[^\\s{_CONTROL}][^{_CONTROL}]*$"
NO_NUL_PATTERN = "^[^\\x00]*$"
_ASCII_INT = re.compile(r"[0-9]{1,19}")
_ISO_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


class InvalidInput(ValueError):
    """Input refused at the edge; says which field and why."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def _describe(char: str) -> str:
    return f"a control character (U+{ord(char):04X})"


def check_text(value: str, field: str, *, multiline: bool = True) -> str:
    found = (_CONTROL_CHARS if multiline else _CONTROL_OR_BREAK).search(value)
    if found:
        where = "" if multiline else " (one line only)"
        raise InvalidInput(field, f"contains {_describe(found.group())}{where}")
    return value


def parse_int(raw: Any, field: str, *, minimum: int = 0, maximum: int = MAX_INT) -> int:
    text = str(raw).strip()
    if not _ASCII_INT.fullmatch(text):
        raise InvalidInput(field, f"not a whole number (digits 0-9): {text[:40]!r}")
    number = int(text)
    if not minimum <= number <= maximum:
        raise InvalidInput(field, f"{number} is out of range ({minimum} to {maximum})")
    return number


def parse_date(raw: Any, field: str) -> date:
    text = str(raw).strip()
    if not _ISO_DATE.fullmatch(text):
        raise InvalidInput(field, f"not a date (YYYY-MM-DD): {text[:40]!r}")
    try:
        day = date.fromisoformat(text)
    except ValueError:
        raise InvalidInput(field, f"no such day: {text!r}") from None
    if not MIN_DATE <= day <= MAX_DATE:
        raise InvalidInput(field, f"{text} is out of range ({MIN_DATE} to {MAX_DATE})")
    return day


def check_datetime(value: datetime, field: str) -> datetime:
    """An aware time within the dates any filter takes (a cursor's, say)."""
    if value.tzinfo is None:
        raise InvalidInput(field, "a time without a time zone")
    if not MIN_DATE <= value.date() <= MAX_DATE:
        raise InvalidInput(field, f"{value.date()} is out of range ({MIN_DATE} to {MAX_DATE})")
    return value


def json_depth(text: str) -> int:
    """How deep a JSON text nests, read without parsing it (brackets in strings skipped)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text} is too large for a JSON number")
    return number


def check_json_value(value: Any, field: str) -> Any:
    """Refuse what no jsonb column can hold: NUL in a string or key, NaN, infinities."""

    def walk(item: Any, path: str) -> None:
        if isinstance(item, str):
            if "\x00" in item:
                raise InvalidInput(path, "a string holds a NUL character")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidInput(path, "not a finite number")
        elif isinstance(item, dict):
            for key, inner in item.items():
                if "\x00" in str(key):
                    raise InvalidInput(path, "a key holds a NUL character")
                walk(inner, f"{path}.{key}")
        elif isinstance(item, list):
            for index, inner in enumerate(item):
                walk(inner, f"{path}[{index}]")

    walk(value, field)
    return value


def load_json(
    raw: str | bytes, field: str, *, max_depth: int = MAX_JSON_DEPTH, storable: bool = True
) -> Any:
    """Parse JSON from a request: depth checked first, then parsed, then (unless the
    fields it holds are checked one by one later) checked for what storage cannot hold."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput(field, "not UTF-8 text") from None
    depth = json_depth(raw)
    if depth > max_depth:
        raise InvalidInput(field, f"nests {depth} levels deep (at most {max_depth})")
    try:
        value = json.loads(raw, parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(field, f"not valid JSON: {exc}") from None
    return check_json_value(value, field) if storable else value


# --- The API's types ---------------------------------------------------------------------------


def _no_control(value: str) -> str:
    found = _CONTROL_CHARS.search(value)
    if found:
        raise ValueError(f"contains {_describe(found.group())}")
    return value


def one_line(value: str) -> str:
    found = _CONTROL_OR_BREAK.search(value)
    if found:
        raise ValueError(f"contains {_describe(found.group())} (one line only)")
    return value


# The validators give the messages; the patterns tell the OpenAPI document's readers (and
# a client generating requests from it) what is accepted.
SingleLineText = Annotated[
    str, AfterValidator(one_line), Field(json_schema_extra={"pattern": SINGLE_LINE_PATTERN})
]
MultiLineText = Annotated[
    str, AfterValidator(_no_control), Field(json_schema_extra={"pattern": MULTILINE_PATTERN})
]
# Text a person must type something into (an input, a message): blank text is the
# services' to refuse (400, "must not be empty"), as for every other caller.
RequiredText = Annotated[
    str, AfterValidator(_no_control), Field(json_schema_extra={"pattern": NOT_BLANK_PATTERN})
]

_NoNul = Annotated[str, Field(pattern=NO_NUL_PATTERN)]
if TYPE_CHECKING:
    # mypy cannot follow a recursive TypeAliasType; only pydantic reads this one.
    _JsonSchema: TypeAlias = Any
else:
    _JsonSchema = TypeAliasType(
        "JsonValue",
        Union[  # noqa: UP007 (a recursive alias needs the Union form)
            _NoNul,
            int,
            float,
            bool,
            None,
            list["_JsonSchema"],
            Annotated[
                dict[_NoNul, "_JsonSchema"],
                Field(json_schema_extra={"propertyNames": {"pattern": NO_NUL_PATTERN}}),
            ],
        ],
    )


def _json_value(value: Any) -> Any:
    try:
        return check_json_value(value, "value")
    except InvalidInput as exc:
        raise ValueError(f"{exc.field.removeprefix('value')}: {exc.problem}".lstrip(": ")) from None


# Any JSON value storage can hold (a tool's output, say): validated by one function, so an
# error names the place in the value; described by a recursive schema in the OpenAPI
# document.
JsonValue = Annotated[Any, PlainValidator(_json_value, json_schema_input_type=_JsonSchema)]


class StrictJSONParser(Parser):
    """The API's request bodies: checked for depth before they are parsed, and objects.
    django-ninja turns a failure into a 400 whose cause the API's handler reports."""

    def parse_body(self, request: HttpRequest) -> dict[str, Any]:
        # The schemas check each field they keep (what they ignore is never stored).
        value = load_json(request.body, "body", storable=False)
        if not isinstance(value, dict):
            raise InvalidInput("body", f"must be a JSON object, not {_json_kind(value)}")
        return value


def _json_kind(value: Any) -> str:
    kinds: dict[type, str] = {list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return kinds.get(type(value), "a number")


# --- Every request ------------------------------------------------------------------------------


def request_problem(request: HttpRequest, *, forms: bool = True) -> InvalidInput | None:
    """The first query or form parameter that has no name, or a control character in its
    name or value."""
    sources = [("query parameter", request.GET)]
    if (
        forms
        and request.method == "POST"
        and request.content_type
        in (
            "application/x-www-form-urlencoded",
            "multipart/form-data",
        )
    ):
        try:
            sources.append(("form field", request.POST))
        except MultiPartParserError as exc:  # no boundary, a cut-off part, ...
            return InvalidInput("request body", f"not valid multipart form data ({exc})")
    for kind, params in sources:
        for name, values in params.lists():
            if not name:
                return InvalidInput(kind, "one has no name (`?=value`)")
            try:
                check_text(name, f"{kind} name {name[:40]!r}", multiline=False)
                for value in values:
                    check_text(value, f"{kind} {name!r}")
            except InvalidInput as exc:
                return exc
    return None


def _form_body(request: HttpRequest) -> bool:
    if request.content_type not in ("multipart/form-data", "application/x-www-form-urlencoded"):
        return False
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0) > 0
    except ValueError:
        return True  # a length that is not a number: refused with the rest


class InputGuardMiddleware:
    """Refuses a request whose query or form parameters hold control characters, before
    any view (the log-in form, a search, an admin filter) passes them to a query."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        api = request.path.startswith("/api/")
        if api and request.method in ("POST", "PUT", "PATCH") and _form_body(request):
            # The API reads JSON (and an import's file): a form body is refused, unread
            # (reading it would leave the raw body unreadable for the API's parser). An
            # empty one is no body: many clients label a bodiless POST as a form.
            return JsonResponse(
                {
                    "error": "unsupported_media_type",
                    "detail": f"request bodies are JSON, not {request.content_type}",
                },
                status=415,
            )
        # The API takes no form fields; reading them is the dashboard's check. Its query
        # parameters are the API's own check (sessions_app.api.routes).
        problem = request_problem(request, forms=not api)
        if problem is None:
            return self.get_response(request)
        if api:
            return JsonResponse({"error": "invalid", "detail": str(problem)}, status=400)
        # The dashboard's own 400 page (config.urls' handler400), naming the problem.
        raise BadRequest(f"{problem}.")


def command_meta(command: str) -> dict[str, Any]:
    """What an audit record keeps about a `manage.py` command: the channel (`cli`), the
    command, and the operating-system user who ran it, where the system knows one."""
    import getpass

    meta: dict[str, Any] = {"via": "cli", "command": command}
    try:
        meta["os_user"] = getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (some containers)
        pass
    return meta


def _trusted(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in settings.RESPAWN_TRUSTED_PROXIES)


def client_address(request: HttpRequest | None) -> str | None:
    """The address of the client a request came from. REMOTE_ADDR, unless that is one of
    RESPAWN_TRUSTED_PROXIES: then X-Forwarded-For, read from the right (each proxy appends
    the address it saw connect), past every trusted proxy, names it. Entries left of the
    first untrusted one are the client's own to write and are never read. From anywhere
    else X-Forwarded-For is ignored."""
    if request is None:
        return None
    address = request.META.get("REMOTE_ADDR") or None
    if address is None or not _trusted(address):
        return address
    hops = [h.strip() for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
    for hop in reversed(hops):
        try:
            ipaddress.ip_address(hop)
        except ValueError:  # not an address (or no header): the last proxy's word stops here
            return address
        address = hop
        if not _trusted(hop):
            return hop
    return address


def request_meta(request: HttpRequest, via: str) -> dict[str, Any]:
    """What an audit record keeps about a request: the channel, the client's address and
    the User-Agent (cut short; scrubbed on its way to storage like everything else)."""
    return {
        "via": via,
        "ip": client_address(request),
        "user_agent": request.headers.get("User-Agent", "")[:MAX_USER_AGENT],
    }


# --- Blobs an edit writes: what the engine must still load ----------------------------------

# What a broken blob can raise on its way through the upgraders and the state's from_dict.
LOAD_ERRORS = (IncompatibleSchemaError, StateError, KeyError, TypeError, ValueError, AttributeError)


def _problem(exc: Exception) -> str:
    """What is wrong with a blob, naming the field, as a person fixes it: the engine's
    own words (`problem`), not the chain of loaders that met it or a bare Python error."""
    problem = getattr(exc, "problem", None)
    if problem:
        return str(problem)
    if isinstance(exc, KeyError):
        return f"missing the key {exc}"
    return str(exc) or type(exc).__name__


def validate_step_payload_json(kind: str, payload: Any, schema_version: int) -> None:
    """Refuse a payload that agent_runtime cannot load as a `kind` step stored at
    `schema_version`. The one place the admin calls the engine's step loader."""
    try:
        load_step_payload(kind, payload, schema_version)
    except LOAD_ERRORS as exc:
        raise ValidationError(
            "This %(kind)s payload does not load at schema version %(version)s: %(error)s",
            code="schema",
            params={"kind": kind, "version": schema_version, "error": _problem(exc)},
        ) from exc


def validate_checkpoint_state_json(state: Any, schema_version: int) -> None:
    """Refuse a state that agent_runtime cannot load, or whose own schema_version is not
    the one the checkpoint is stored at (the version is history: not editable)."""
    if not isinstance(state, dict):
        raise ValidationError("A checkpoint state must be a JSON object.", code="schema")
    if state.get("schema_version") != schema_version:
        raise ValidationError(
            "The state's schema_version must stay %(version)s (found %(found)r).",
            code="schema_version",
            params={"version": schema_version, "found": state.get("schema_version")},
        )
    try:
        load_state(state)
    except LOAD_ERRORS as exc:
        raise ValidationError(
            "This state does not load at schema version %(version)s: %(error)s",
            code="schema",
            params={"version": schema_version, "error": _problem(exc)},
        ) from exc
