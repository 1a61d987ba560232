"""The JSON API for agent clients (django-ninja: pydantic schemas and OpenAPI for free).

Authentication is a per-user bearer token (`manage.py create_api_token USER`). Reads need
the viewer role, everything that changes a session the operator role: the same rules as
the dashboard, because every action goes through `services`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Field, NinjaAPI, Query, Schema
from ninja import Status as Reply
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.security import HttpBearer
from pydantic import AfterValidator, ConfigDict, WithJsonSchema, model_validator

from agent_runtime.state import SCHEMA_VERSION
from agent_runtime.upgraders import IncompatibleSchemaError, load_step_payload

from ..models import AgentSession, SessionNote, Status, Step
from ..permissions import can_operate, can_view, session_scope, with_token
from ..runtime import agent_registry
from ..selectors import core as selectors
from ..services import core as services
from ..services import credentials
from ..services.workqueue import owner_name, session_add_note, session_hand, session_take
from ..validation import (
    NOT_BLANK_PATTERN,
    SINGLE_LINE_PATTERN,
    InvalidInput,
    JsonValue,
    MultiLineText,
    RequiredText,
    SingleLineText,
    StrictJSONParser,
    one_line,
    parse_date,
)
from ..web.http import API, ApiRequest, bearer_token, code_of, request_meta
from ..web.middleware import unavailable_response

MAX_PAGE = 200


class CredentialsLocked(Exception):
    """This client guessed wrong too often (sessions_app.services.credentials)."""


class BearerToken(HttpBearer):
    def __call__(self, request: HttpRequest) -> Any:
        # Not HttpBearer's own __call__: that one logs the header it rejects under DEBUG.
        token = bearer_token(request)
        if token is None:
            return None
        if credentials.locked(request):  # right or wrong, until the window has passed
            raise CredentialsLocked
        user = self.authenticate(request, token)
        if user is None and not hasattr(request, "_respawn_token_refused"):
            credentials.failed(request, credentials.API_TOKEN)
        return user

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        found, refused = selectors.api_token(token)
        if refused is not None:
            # A real token, no longer valid: said so (auth_error), and not a guess.
            request._respawn_token_refused = refused  # type: ignore[attr-defined]
        if found is None:
            return None
        services.api_token_used(token=found)
        # What the request may do is the token's, within its user's (permissions.access).
        user = with_token(found.user, found)
        request.user = user
        return user


class RespawnAPI(NinjaAPI):
    def get_openapi_schema(self, **kwargs: Any) -> Any:
        schema = super().get_openapi_schema(**kwargs)
        for item in schema.get("paths", {}).values():
            for operation in item.values():
                for parameter in operation.get("parameters", []):
                    if parameter.get("in") == "query" and not parameter.get("required"):
                        parameter["schema"] = _without_null(parameter["schema"])
        return schema


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    """An optional query parameter is left out, never null (a query string has no null):
    its schema is the one of its value."""
    branches = schema.get("anyOf")
    if not branches:
        return schema
    values = [b for b in branches if b != {"type": "null"}]
    if len(values) != 1 or len(values) == len(branches):
        return schema
    rest = {k: v for k, v in schema.items() if k != "anyOf"}
    return {**values[0], **rest}


def _for_people_and_programs(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """The API's docs and its OpenAPI schema are for someone who may use it: a logged-in
    person who may view sessions, or a program with an API token. Anyone else is sent to
    log in (a browser asking for the docs) or told to send a token."""

    @functools.wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        user = request.user if request.user.is_authenticated else BearerToken()(request)
        if user is None:
            if request.path.endswith(api.docs_url or "/docs"):
                from django.contrib.auth.views import redirect_to_login

                return redirect_to_login(request.get_full_path())
            return JsonResponse(
                {
                    "error": "unauthorized",
                    "detail": "send a valid API token: Authorization: Bearer <token>",
                },
                status=401,
            )
        if not can_view(user):
            return JsonResponse(
                {"error": "forbidden", "detail": "this account may not view sessions"},
                status=403,
            )
        return view(request, *args, **kwargs)

    return guarded


api = RespawnAPI(
    title="Respawn API",
    version="1",
    description="Start, follow and steer durable agent sessions.",
    urls_namespace="api",
    auth=BearerToken(),
    docs_url="/docs",
    docs_decorator=_for_people_and_programs,
    # Bodies are checked for depth before they are parsed, and must be JSON objects.
    parser=StrictJSONParser(),
)


@functools.cache
def _declared_query_parameters() -> list[tuple[re.Pattern[str], str, frozenset[str]]]:
    """(path, method, the query parameters it declares) for every operation, from the
    OpenAPI document: the one list of what each operation takes."""
    spec = api.get_openapi_schema()
    declared = []
    for path, item in spec["paths"].items():
        pattern = re.compile("^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(path)) + "$")
        for method, operation in item.items():
            names = {p["name"] for p in operation.get("parameters", []) if p["in"] == "query"}
            declared.append((pattern, method.upper(), frozenset(names)))
    return declared


def undeclared_query_parameter(request: HttpRequest) -> str | None:
    """The first query parameter the requested API operation does not take (such a
    parameter is refused, not ignored: a misspelt filter must not list everything)."""
    given = set(request.GET)
    if not given:
        return None
    for pattern, method, names in _declared_query_parameters():
        if method == request.method and pattern.match(request.path):
            unknown = sorted(given - names)
            return unknown[0] if unknown else None
    return None


def api_query_problem(request: HttpRequest) -> InvalidInput | None:
    """The API's query parameters: each one the operation declares, once. `?status=a&status=b`
    is refused rather than read as one of them, `?stauts=a` rather than ignored."""
    for name, values in request.GET.lists():
        if len(values) > 1:
            return InvalidInput(f"query parameter {name!r}", f"given {len(values)} times (once)")
    unknown = undeclared_query_parameter(request)
    if unknown is not None:
        return InvalidInput(
            f"query parameter {unknown!r}", "this operation takes no such parameter"
        )
    return None


def refuse_undeclared_query(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Every operation's first check, before authentication: a query parameter it does not
    declare, or one given twice, is a 400 naming it."""

    @functools.wraps(view)
    def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        problem = api_query_problem(request)
        if problem is not None:
            return JsonResponse({"error": "invalid", "detail": str(problem)}, status=400)
        return view(request, *args, **kwargs)

    return checked


api.add_decorator(refuse_undeclared_query, mode="view")


# --- Schemas ----------------------------------------------------------------------------


class ErrorOut(Schema):
    error: str = Field(description="a machine-readable code")
    detail: str = Field(description="what is wrong, for a person")


class CountersOut(Schema):
    steps: int
    tokens_in: int
    tokens_out: int
    cost: float


class PendingApprovalOut(Schema):
    call_id: str
    tool: str
    arguments: dict[str, Any]
    requested_at: str | None = None


class ProgressOut(Schema):
    done: int
    total: int
    note: str | None = Field(None, description="what a running tool last reported")


class SessionOut(Schema):
    id: UUID
    agent: str
    agent_version: str = Field(
        description="the agent version the session started on ('' when it was not recorded)"
    )
    title: str
    status: str
    head: int
    last_seq: int
    counters: CountersOut
    pending_approval: PendingApprovalOut | None = None
    uncertain_call: dict[str, Any] | None = Field(
        None, description="a non-idempotent tool call a crash left without result: decide it"
    )
    final_answer: str | None = None
    progress: ProgressOut | None = Field(
        None, description="batch work: records done / total, as of the head checkpoint"
    )
    last_error: str | None = None
    failed_calls: int = Field(
        0,
        description="tool calls whose result is an error, counted when the session completed "
        "(a session that completed with failed calls may be missing their effects)",
    )
    incompatible: str | None = Field(
        None, description="why no worker with the current code can run it, if none can"
    )
    parent: UUID | None = None
    fork_seq: int | None = None
    stuck: bool
    legal_hold: bool = Field(description="retention policies never delete anything of it")
    owner: str | None = Field(
        None, description="the username of who took the session (the work queue); null: nobody"
    )
    owned_since: datetime | None = Field(None, description="when its owner took it")
    damaged: list[str] = Field(
        default_factory=list,
        description="what of the row cannot be shown as stored (written by hand with SQL or "
        "by an older release; its times are then given as the nearest ones that can): "
        "repair it in the admin",
    )
    created_at: datetime
    updated_at: datetime


class ToolOut(Schema):
    name: str
    description: str
    parameters: dict[str, Any] = Field(description="the JSON schema of its arguments")
    idempotent: bool | None = Field(description="null: a runner's tool, run by its runner")
    needs_approval: bool
    timeout: float | None
    retries: int


class LimitsOut(Schema):
    max_steps: int
    max_tokens: int | None
    max_cost: float | None
    max_seconds: float | None = Field(description="wall time from a session's start")
    max_parallel_tools: int


class LiveVersionOut(Schema):
    version: str = Field(description="the version sessions started on ('' when unrecorded)")
    sessions: int


class AgentOut(Schema):
    name: str
    version: str
    description: str
    kind: str = Field(description="Respawn's loop, or what its runner runs (LangGraph graph, ...)")
    model: str
    limits: LimitsOut
    nodes: list[str] = Field(description="a graph's nodes; empty for other agents")
    state_version: int | None = Field(description="its own state's version; null: none")
    compatible_since: str | None
    tools: list[ToolOut]
    live_sessions: list[LiveVersionOut] = Field(
        description="sessions not completed, failed or cancelled, by version started on"
    )


class SessionPage(Schema):
    items: list[SessionOut]
    next: str | None = Field(description="cursor of the next page; null on the last one")


class StepOut(Schema):
    seq: int
    kind: str
    payload: dict[str, Any] = Field(description="at the current schema version")
    schema_version: int
    load_error: str | None = Field(None, description="why this code cannot load the payload")
    superseded: bool
    started_at: datetime | None
    finished_at: datetime | None
    tokens_in: int
    tokens_out: int
    idempotency_key: str | None


class StepPage(Schema):
    items: list[StepOut]
    next: int | None = Field(description="pass as `after` for the next page; null when done")


# A day as the dashboard's filters take it (validation.parse_date: 1900 to 2999).
DAY = WithJsonSchema(
    {"type": "string", "format": "date", "pattern": "^(19|2[0-9])[0-9]{2}-[0-9]{2}-[0-9]{2}$"}
)


def _known_agents(schema: dict[str, Any]) -> None:
    # When the document is generated, not at import: the registry comes from settings.
    schema["enum"] = sorted(agent_registry().names())


# An unknown name is the service's to refuse (400, naming the known ones); the document
# lists the known ones.
AgentName = Annotated[str, AfterValidator(one_line), Field(json_schema_extra=_known_agents)]


class BudgetsIn(Schema):
    """Limits for one session; a field left out keeps its value (the agent's limit at
    start), null lifts a token, cost or time limit. Reaching one pauses the session."""

    # Required when given: a step limit cannot be lifted (null is refused); left out, it
    # keeps its value, so it has a default all the same.
    max_steps: int = Field(  # type: ignore[assignment]
        None, ge=1, le=10**9, description="steps of the trace"
    )
    max_tokens: int | None = Field(
        None, ge=1, le=10**12, description="input + output tokens of every model call"
    )
    max_cost: float | None = Field(None, gt=0, le=10**9, description="US dollars")
    max_seconds: float | None = Field(
        None, gt=0, le=10**9, description="wall time from the session's start"
    )

    # A misspelt budget is refused, not ignored.
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _an_object_of_numbers(cls, value: Any) -> Any:
        # ninja's Schema reads the attributes of anything (it wraps the input first);
        # budgets are a JSON object of numbers (true is not 1).
        given = getattr(value, "_obj", value)
        if not isinstance(given, dict):
            raise ValueError(f"budgets must be an object, got {type(given).__name__}")
        for name, number in given.items():
            if isinstance(number, bool) or not isinstance(number, int | float | None):
                if name != "resume":
                    raise ValueError(f"{name} must be a number, got {type(number).__name__}")
        return value

    def given(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


class StartIn(Schema):
    agent: AgentName = Field(min_length=1, max_length=100)
    input: RequiredText = Field(max_length=services.MAX_INPUT_CHARS)
    title: SingleLineText = Field("", max_length=300)
    budgets: BudgetsIn | None = Field(None, description="this session's own limits")


class SetBudgetsIn(BudgetsIn):
    # At least one budget (resume alone changes nothing).
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"anyOf": [{"required": [name]} for name in services.BUDGET_FIELDS]},
    )

    resume: bool = Field(True, description="queue a paused or failed session to continue")


class BudgetOut(Schema):
    name: str = Field(description="steps | tokens | cost | time (seconds)")
    limit: float | None = Field(description="null: no limit")
    used: float
    reached: bool


class BudgetsOut(Schema):
    budgets: list[BudgetOut]
    deadline_at: datetime | None = Field(description="when the wall-time budget ends")
    paused_by: str | None = Field(description="the budget reached, if it paused the session")


class UsageTotalOut(Schema):
    calls: int
    tokens_in: int
    tokens_out: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost: float = Field(description="US dollars")
    unpriced_calls: int = Field(description="calls of models without a price (counted as 0)")


class UsageRowOut(UsageTotalOut):
    key: str = Field(description="the day (YYYY-MM-DD), agent or model (provider:model)")


class UsageOut(Schema):
    group: str
    items: list[UsageRowOut]
    total: UsageTotalOut


class MessageIn(Schema):
    content: RequiredText = Field(max_length=services.MAX_INPUT_CHARS)


class CheckpointIn(Schema):
    checkpoint_seq: int = Field(ge=0, le=2_147_483_647)


class UncertainIn(Schema):
    # Checked by the service (400 naming the choices); listed here for clients.
    resolution: str = Field(
        description="rerun | record_result | fail",
        json_schema_extra={"enum": list(services.UNCERTAIN_CHOICES)},
    )
    output: JsonValue = Field(None, description="with record_result: what the tool returned")
    note: MultiLineText = Field("", max_length=2000)


class HoldIn(Schema):
    # Holding without a note is the service's to refuse (400); the schema says so too.
    model_config = ConfigDict(
        json_schema_extra={
            "if": {"properties": {"hold": {"const": True}}},
            "then": {"required": ["note"], "properties": {"note": {"pattern": NOT_BLANK_PATTERN}}},
        }
    )

    hold: bool
    note: MultiLineText = Field(
        "", max_length=300, description="why (a case or ticket); required to hold"
    )


class TakeIn(Schema):
    seen_owner: SingleLineText | None = Field(
        None,
        max_length=150,
        description="the owner you saw: null (or left out) when it was unassigned, a "
        "username to take it over from them. 409 `owner_changed` when it is no longer so",
    )


# The body may be left out (the session was seen unassigned).
NO_OWNER_SEEN = TakeIn(seen_owner=None)


class HandIn(Schema):
    to: SingleLineText | None = Field(
        description="the operator to hand it to; null or empty: back in the queue (no owner)",
        max_length=150,
    )
    seen_owner: SingleLineText | None = Field(
        None,
        max_length=150,
        description="the owner you saw (null: unassigned); 409 `owner_changed` when it is "
        "no longer so",
    )


class NoteIn(Schema):
    text: RequiredText = Field(
        max_length=services.MAX_REASON_CHARS, description="plain text, shown as written"
    )


class NoteOut(Schema):
    id: int
    author: str
    text: str = Field(description="plain text (never HTML or Markdown)")
    seq: int = Field(description="the session's last step when it was written")
    created_at: datetime


class DecisionIn(Schema):
    reason: MultiLineText = Field("", max_length=2000)


# The body may be left out (no reason given); when sent it is an object, never null.
NO_REASON = DecisionIn(reason="")


class AnswerIn(Schema):
    value: JsonValue = Field(description="what the graph's interrupt() returns when it resumes")


# --- Helpers ----------------------------------------------------------------------------


def _meta(request: HttpRequest) -> dict[str, Any]:
    return request_meta(request, API)


def _require_view(request: ApiRequest) -> None:
    if not can_view(request.auth):
        raise HttpError(403, "your account may not read sessions (needs the viewer role)")


def _require_operate(request: ApiRequest) -> None:
    if not can_operate(request.auth):
        raise HttpError(403, "your account may not change sessions (needs the operator role)")


def _session_out(session: AgentSession, pending: dict | None = None) -> dict[str, Any]:
    return {
        "id": session.id,
        "agent": session.agent,
        "agent_version": session.agent_version,
        "title": session.title,
        "status": session.status,
        "head": session.head,
        "last_seq": session.last_seq,
        "counters": {
            "steps": session.step_count,
            "tokens_in": session.tokens_in,
            "tokens_out": session.tokens_out,
            "cost": float(session.cost),
        },
        "pending_approval": pending,
        "final_answer": session.final_answer or None,
        "progress": (
            {
                "done": session.progress_done or 0,
                "total": session.progress_total,
                "note": session.progress_note or None,
            }
            if session.progress_total is not None
            else None
        ),
        "last_error": session.last_error or None,
        "failed_calls": session.failed_calls,
        "incompatible": session.incompatible_reason or None,
        "parent": session.parent_id,
        "fork_seq": session.fork_seq,
        "damaged": session.damage(),
        "stuck": session.is_stuck(),
        "legal_hold": session.legal_hold,
        "owner": owner_name(session) or None,
        "owned_since": session.owned_since,
        "created_at": session.created_at,
        "updated_at": session.updated_at,
    }


def _pending(state: dict[str, Any]) -> dict | None:
    pending = state.get("pending_approval")
    if not pending:
        return None
    return {k: pending.get(k) for k in ("call_id", "tool", "arguments", "requested_at")}


def _get(request: ApiRequest, session_id: UUID) -> AgentSession:
    """The session, if the token may read it; 404 otherwise, whether it exists or not."""
    session = selectors.session_by_id(session_id, session_scope(request.auth))
    if session is None:
        raise services.ActionError(f"no session with id {session_id}", code="not_found")
    return session


def _detail(session: AgentSession) -> dict[str, Any]:
    if not session.can_decide():
        return _session_out(session)
    # One read of the head checkpoint serves both: what waits for approval, what is uncertain.
    state = selectors.head_state(session)
    out = _session_out(session, _pending(state))
    call = selectors.uncertain_call(session, state)
    if call is not None:
        out["uncertain_call"] = {
            k: call.get(k)
            for k in ("call_id", "tool", "arguments", "tool_call_seq", "idempotency_key")
        }
    return out


def _act(
    request: ApiRequest,
    action: Callable[..., AgentSession],
    status: int,
    session_id: UUID,
    **given: Any,
):
    """An operator's action on a session (a service, which checks and audits it), answered
    with the session as it is now."""
    _require_operate(request)
    session = action(
        session_id=session_id, **given, actor=request.auth, request_meta=_meta(request)
    )
    return Reply(status, _detail(session))


def _loaded_payload(step: Step) -> dict[str, Any]:
    """The payload at the current schema (what a worker loads); as stored, with the
    reason, when this code cannot load it."""
    try:
        loaded = load_step_payload(step.kind, step.payload, step.schema_version)
    except IncompatibleSchemaError as exc:
        # A payload written by hand may be any JSON: one that is not an object is given
        # inside one, so the answer keeps its documented shape.
        stored = step.payload if isinstance(step.payload, dict) else {"stored": step.payload}
        return {"payload": stored, "schema_version": step.schema_version, "load_error": str(exc)}
    return {"payload": loaded.value, "schema_version": SCHEMA_VERSION, "load_error": None}


# --- Errors: always JSON, always naming the problem --------------------------------------


@api.exception_handler(OperationalError)
@api.exception_handler(InterfaceError)
def database_unavailable(request: HttpRequest, exc: Exception):
    # The database is down, restarting or out of connections: a quick JSON 503 with
    # Retry-After, not a 500 (the wait for a connection is bounded by RESPAWN_DB_WAIT).
    # A replica that failed is the exception: the page is served again from the primary.
    from ..web.replicas import failed_on_replica

    failed_on_replica(request, exc)
    return unavailable_response(request, exc)


@api.exception_handler(services.ActionError)
def action_error(request: HttpRequest, exc: services.ActionError):
    return api.create_response(request, {"error": exc.code, "detail": str(exc)}, status=exc.status)


@api.exception_handler(HttpError)
def http_error(request: HttpRequest, exc: HttpError):
    if isinstance(exc.__cause__, InvalidInput):
        # The body parser's refusal (too deep, not an object, not JSON): say which.
        return api.create_response(
            request, {"error": "invalid", "detail": str(exc.__cause__)}, status=400
        )
    return api.create_response(
        request,
        {"error": code_of(exc.status_code), "detail": str(exc)},
        status=exc.status_code,
    )


@api.exception_handler(CredentialsLocked)
def credentials_locked(request: HttpRequest, exc: CredentialsLocked):
    wait = credentials.retry_after()
    response = api.create_response(
        request,
        {
            "error": "throttled",
            "detail": "too many wrong credentials from this address: try again in "
            f"{max(1, wait // 60)} minute(s)",
        },
        status=429,
    )
    response["Retry-After"] = str(wait)
    return response


@api.exception_handler(AuthenticationError)
def auth_error(request: HttpRequest, exc: AuthenticationError):
    refused = getattr(request, "_respawn_token_refused", None)
    return api.create_response(
        request,
        {
            "error": "unauthorized",
            "detail": f"{refused}: send a valid API token"
            if refused
            else "send a valid API token: Authorization: Bearer <token>",
        },
        status=401,
    )


@api.exception_handler(ValidationError)
def validation_error(request: HttpRequest, exc: ValidationError):
    problems = []
    for err in exc.errors:
        where = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body", "payload"))
        problems.append(f"{where or 'body'}: {err.get('msg')}")
    return api.create_response(
        request,
        {"error": "invalid", "detail": "; ".join(problems), "problems": exc.errors},
        status=422,
    )


# --- Endpoints --------------------------------------------------------------------------

ERRORS = {
    400: ErrorOut,
    401: ErrorOut,
    403: ErrorOut,
    404: ErrorOut,
    409: ErrorOut,
    422: ErrorOut,
    429: ErrorOut,
}


@api.post("/sessions", response={201: SessionOut, **ERRORS}, summary="Start a session")
def start(request: ApiRequest, body: StartIn):
    _require_operate(request)
    session = services.session_start(
        agent=body.agent,
        input=body.input,
        title=body.title,
        budgets=body.budgets.given() if body.budgets is not None else None,
        actor=request.auth,
        request_meta=_meta(request),
    )
    return Reply(201, _detail(session))


@api.get("/sessions", response={200: SessionPage, **ERRORS}, summary="List sessions")
def list_sessions(
    request: ApiRequest,
    # Checked below (400 naming the statuses); listed in the schema for clients.
    status: Annotated[str, WithJsonSchema({"type": "string", "enum": Status.values})]
    | None = Query(None, description="one of " + ", ".join(Status.values)),
    agent: str | None = Query(None, max_length=100, pattern=SINGLE_LINE_PATTERN),
    agent_version: str | None = Query(
        None,
        max_length=50,
        pattern=SINGLE_LINE_PATTERN,
        description="the agent version sessions started on",
    ),
    cursor: Annotated[
        str, WithJsonSchema({"type": "string", "maxLength": 200, "pattern": "^[A-Za-z0-9_-]*$"})
    ]
    | None = Query(None, max_length=200, description="`next` of the previous page"),
    limit: int = Query(50, ge=1, le=MAX_PAGE),
    owner: str | None = Query(
        None,
        max_length=150,
        pattern=SINGLE_LINE_PATTERN,
        description="`me` (yours), `unassigned` (nobody's) or a username (one no user "
        "has matches no session)",
    ),
):
    _require_view(request)
    if status is not None and status not in Status.values:
        raise HttpError(400, f"unknown status {status!r} (one of {', '.join(Status.values)})")
    owned = selectors.api_owner_q(owner, request.auth) if owner else None
    try:
        page, after = selectors.api_session_page(
            status=status,
            agent=agent,
            agent_version=agent_version,
            cursor=cursor,
            size=limit,
            owner=owned,
            scope=session_scope(request.auth),
        )
    except selectors.BadFilter:
        raise HttpError(400, "cursor is not one this API returned") from None
    return {"items": [_session_out(s, None) for s in page], "next": after}


@api.get("/agents", response={200: list[AgentOut], **ERRORS}, summary="The agents")
def list_agents(request: ApiRequest):
    """The agents this deployment runs (RESPAWN_AGENTS and installed packages)."""
    from ..selectors.core import agents_overview

    _require_view(request)
    registry = agent_registry()
    out = []
    for view in agents_overview(session_scope(request.auth)).agents:
        agent = registry.get(view.name)
        out.append(
            {
                "name": view.name,
                "version": view.version,
                "description": view.description,
                "kind": view.kind,
                "model": view.model,
                "nodes": view.nodes,
                "limits": {
                    "max_steps": agent.limits.max_steps,
                    "max_tokens": agent.limits.max_tokens,
                    "max_cost": agent.limits.max_cost,
                    "max_seconds": agent.limits.max_seconds,
                    "max_parallel_tools": agent.limits.max_parallel_tools,
                },
                "state_version": view.state_version,
                "compatible_since": view.compatible_since,
                "tools": [
                    {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.json_schema,
                        "idempotent": t.idempotent,
                        "needs_approval": t.needs_approval,
                        "timeout": t.timeout,
                        "retries": t.retries,
                    }
                    for t in view.tools
                ],
                "live_sessions": [{"version": v, "sessions": n} for v, n in view.live],
            }
        )
    return out


@api.get("/sessions/{session_id}", response={200: SessionOut, **ERRORS}, summary="A session")
def get_session(request: ApiRequest, session_id: UUID):
    _require_view(request)
    return _detail(_get(request, session_id))


@api.get("/sessions/{session_id}/steps", response={200: StepPage, **ERRORS}, summary="Its steps")
def list_steps(
    request: ApiRequest,
    session_id: UUID,
    after: int = Query(0, ge=0, le=2_147_483_647, description="return steps with seq > after"),
    limit: int = Query(100, ge=1, le=MAX_PAGE),
    include_superseded: bool = Query(True),
):
    _require_view(request)
    page, following = selectors.steps_page(
        _get(request, session_id), after=after, size=limit, include_superseded=include_superseded
    )
    return {
        "items": [
            {
                "seq": s.seq,
                "kind": s.kind,
                **_loaded_payload(s),
                "superseded": s.superseded_at is not None,
                "started_at": s.started_at,
                "finished_at": s.finished_at,
                "tokens_in": s.tokens_in,
                "tokens_out": s.tokens_out,
                "idempotency_key": s.idempotency_key,
            }
            for s in page
        ],
        "next": following,
    }


@api.post(
    "/sessions/{session_id}/messages",
    response={202: SessionOut, **ERRORS},
    summary="Send a message",
)
def send_message(request: ApiRequest, session_id: UUID, body: MessageIn):
    return _act(request, services.session_send_message, 202, session_id, content=body.content)


@api.post("/sessions/{session_id}/resume", response={202: SessionOut, **ERRORS}, summary="Resume")
def resume(request: ApiRequest, session_id: UUID):
    return _act(request, services.session_resume, 202, session_id)


@api.post("/sessions/{session_id}/cancel", response={200: SessionOut, **ERRORS}, summary="Cancel")
def cancel(request: ApiRequest, session_id: UUID):
    return _act(request, services.session_cancel, 200, session_id)


@api.post(
    "/sessions/{session_id}/rollback", response={200: SessionOut, **ERRORS}, summary="Roll back"
)
def rollback(request: ApiRequest, session_id: UUID, body: CheckpointIn):
    seq = body.checkpoint_seq
    return _act(request, services.checkpoint_rollback, 200, session_id, checkpoint_seq=seq)


@api.post("/sessions/{session_id}/fork", response={201: SessionOut, **ERRORS}, summary="Fork")
def fork(request: ApiRequest, session_id: UUID, body: CheckpointIn):
    seq = body.checkpoint_seq
    return _act(request, services.session_fork, 201, session_id, checkpoint_seq=seq)


@api.post("/sessions/{session_id}/approve", response={202: SessionOut, **ERRORS}, summary="Approve")
def approve(request: ApiRequest, session_id: UUID, body: DecisionIn = NO_REASON):
    return _act(request, services.session_approve, 202, session_id, reason=body.reason)


@api.post(
    "/sessions/{session_id}/answer",
    response={202: SessionOut, **ERRORS},
    summary="Answer a LangGraph interrupt",
)
def answer(request: ApiRequest, session_id: UUID, body: AnswerIn):
    """Resume a LangGraph session waiting in `interrupt()` with `value`."""
    from ..services.graphs import session_answer_interrupt

    return _act(request, session_answer_interrupt, 202, session_id, value=body.value)


@api.post("/sessions/{session_id}/reject", response={202: SessionOut, **ERRORS}, summary="Reject")
def reject(request: ApiRequest, session_id: UUID, body: DecisionIn = NO_REASON):
    """Reject the pending tool call. Its `reason` is required (the model is told why): a
    rejection without one is a 400."""
    return _act(request, services.session_reject, 202, session_id, reason=body.reason)


@api.post(
    "/sessions/{session_id}/uncertain",
    response={202: SessionOut, **ERRORS},
    summary="Decide an uncertain tool call",
)
def resolve_uncertain(request: ApiRequest, session_id: UUID, body: UncertainIn):
    """A non-idempotent tool call that a crash left without a result: run it again, record
    what it returned, or fail the session."""
    return _act(
        request,
        services.session_resolve_uncertain,
        202,
        session_id,
        resolution=body.resolution,
        output=body.output,
        note=body.note,
    )


@api.post("/sessions/{session_id}/hold", response={200: SessionOut, **ERRORS}, summary="Legal hold")
def legal_hold(request: ApiRequest, session_id: UUID, body: HoldIn):
    """Put the session on legal hold (retention never touches it) or release it."""
    return _act(
        request,
        services.session_set_legal_hold,
        200,
        session_id,
        hold=body.hold,
        note=body.note,
    )


# --- The work queue -----------------------------------------------------------------------


@api.post("/sessions/{session_id}/take", response={200: SessionOut, **ERRORS}, summary="Take")
def take(request: ApiRequest, session_id: UUID, body: TakeIn = NO_OWNER_SEEN):
    """Make the session yours (the work queue). Unassigned: taken. Someone else's: taken
    over only when `seen_owner` names them (409 `owner_changed` otherwise, naming who owns
    it now). Audited."""
    return _act(request, session_take, 200, session_id, seen_owner=body.seen_owner or "")


@api.post("/sessions/{session_id}/hand", response={200: SessionOut, **ERRORS}, summary="Hand on")
def hand(request: ApiRequest, session_id: UUID, body: HandIn):
    """Hand the session to another operator, or put it back in the queue (`to` null).
    409 `owner_changed` when its owner is no longer `seen_owner`. Audited."""
    return _act(
        request,
        session_hand,
        200,
        session_id,
        to=body.to or "",
        seen_owner=body.seen_owner or "",
    )


def _note_out(note: SessionNote) -> dict[str, Any]:
    return {
        "id": note.pk,
        "author": note.author_label,
        "text": note.text,
        "seq": note.seq,
        "created_at": note.created_at,
    }


@api.get("/sessions/{session_id}/notes", response={200: list[NoteOut], **ERRORS}, summary="Notes")
def list_notes(request: ApiRequest, session_id: UUID):
    """People's notes on the session, in trace order (at most 500)."""
    _require_view(request)
    notes = selectors.trace_notes(_get(request, session_id), after=0, upto=None)
    return [_note_out(n) for n in notes]


@api.post("/sessions/{session_id}/notes", response={201: NoteOut, **ERRORS}, summary="Leave a note")
def add_note(request: ApiRequest, session_id: UUID, body: NoteIn):
    """A plain-text note on the session, at the step it has reached. Audited."""
    _require_operate(request)
    note = session_add_note(
        session_id=session_id, text=body.text, actor=request.auth, request_meta=_meta(request)
    )
    return Reply(201, _note_out(note))


# --- Budgets and costs ------------------------------------------------------------------


def _budgets_out(session: AgentSession) -> dict[str, Any]:
    from ..selectors.core import session_budgets

    budgets = session_budgets(session)
    paused_by = None
    if session.paused_by_budget:
        paused_by = next((b.name for b in budgets if b.reached), None)
    return {
        "budgets": [
            {"name": b.name, "limit": b.limit, "used": float(b.used), "reached": b.reached}
            for b in budgets
        ],
        "deadline_at": session.deadline_at,
        "paused_by": paused_by,
    }


@api.get("/sessions/{session_id}/budgets", response={200: BudgetsOut, **ERRORS}, summary="Budgets")
def budgets(request: ApiRequest, session_id: UUID):
    """The session's limits as its next run sees them, beside what it has used."""
    _require_view(request)
    return _budgets_out(_get(request, session_id))


@api.post(
    "/sessions/{session_id}/budgets", response={200: BudgetsOut, **ERRORS}, summary="Set budgets"
)
def set_budgets(request: ApiRequest, session_id: UUID, body: SetBudgetsIn):
    """Raise (or lower) the session's budgets; with `resume` (the default) a session a
    budget paused is queued to continue. Audited; recorded in the trace."""
    _require_operate(request)
    changes = body.given()
    changes.pop("resume", None)
    session = services.session_set_budgets(
        session_id=session_id,
        budgets=changes,
        resume=body.resume,
        actor=request.auth,
        request_meta=_meta(request),
    )
    return _budgets_out(session)


@api.get("/usage", response={200: UsageOut, **ERRORS}, summary="Costs and usage")
def usage(
    request: ApiRequest,
    group: Annotated[str, WithJsonSchema({"type": "string", "enum": ["day", "agent", "model"]})] = (
        Query("day", description="day | agent | model")
    ),
    since: Annotated[str, DAY] | None = Query(None, description="first day, inclusive"),
    until: Annotated[str, DAY] | None = Query(None, description="last day, inclusive"),
    agent: str | None = Query(None, max_length=100, pattern=SINGLE_LINE_PATTERN),
):
    """What model calls used and cost, by day, agent or model, with the total. Kept when
    retention deletes the sessions."""
    from ..selectors.core import BadFilter, usage_totals

    _require_view(request)
    try:
        rows, total = usage_totals(
            group=group,
            since=parse_date(since, "since") if since is not None else None,
            until=parse_date(until, "until") if until is not None else None,
            agent=agent,
            scope=session_scope(request.auth),
        )
    except (BadFilter, InvalidInput) as exc:
        raise HttpError(400, str(exc)) from None
    return {"group": group, "items": rows, "total": total}


# --- Export and import ------------------------------------------------------------------

_GZIP_BODY = {"application/gzip": {"schema": {"type": "string", "format": "binary"}}}


@api.post(
    "/sessions/{session_id}/export",
    response=ERRORS,
    summary="Export a session",
    openapi_extra={"responses": {200: {"description": "the export file", "content": _GZIP_BODY}}},
)
def export(request: ApiRequest, session_id: UUID):
    """The session as a file: gzip-compressed JSON lines with every step (superseded ones
    included), checkpoint and audit record, and their schema versions."""
    from django.http import HttpResponse

    from ..upkeep.transfer import export_bytes

    _require_view(request)
    session = _get(request, session_id)
    data = export_bytes(session, actor=request.auth, request_meta=_meta(request))
    response = HttpResponse(data, content_type="application/gzip")
    response["Content-Disposition"] = f'attachment; filename="session-{session.id}.jsonl.gz"'
    return response


@api.post(
    "/imports",
    response={201: SessionOut, **ERRORS},
    summary="Import a session",
    # Any content type: the body is the file's bytes (application/gzip from a browser or
    # curl --data-binary; described as a binary stream).
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    },
)
def import_(
    request: ApiRequest,
    new_ids: bool = Query(False, description="give it a new id (keep both if it exists)"),
):
    """Import an export (the request body is the file). Checked whole, then written in one
    transaction, or nothing is: 400 `bad_export` names the problem."""
    from ..upkeep.transfer import import_session

    _require_operate(request)
    result = import_session(
        request.body, new_ids=new_ids, actor=request.auth, request_meta=_meta(request)
    )
    return Reply(201, _session_out(result.session))
