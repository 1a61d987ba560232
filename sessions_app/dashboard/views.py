"""The operator dashboard. Function views; one view serves a page and its fragments
(`template.html#partial` when the request comes from htmx); links keep their hrefs so
reading works without JavaScript; mutations are POST only and go through `services`."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import quote, urlencode
from uuid import UUID

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import (
    BadRequest,
    PermissionDenied,
    RequestDataTooBig,
    TooManyFieldsSent,
)
from django.db.models import Q
from django.http import Http404, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import Resolver404
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import (
    HttpResponseClientRedirect,
    HttpResponseStopPolling,
    trigger_client_event,
)

from ..models import AgentSession, AuditAction, Checkpoint, Status
from ..models.clock import database_clock
from ..permissions import (
    administered_teams,
    can_operate,
    can_operate_session,
    can_view,
    operate_scope,
    sees_every_team,
    session_scope,
    with_token,
)
from ..selectors import core as selectors
from ..services import core as services
from ..services import credentials
from ..upkeep import search
from ..validation import InvalidInput, parse_date, parse_int
from ..web.http import (
    BULK_LIMIT,
    DASHBOARD,
    HtmxRequest,
    bearer_token,
    parse_uuid,
    parse_uuid_prefix,
    positive_int,
    request_meta,
)
from . import charts, trace
from .actions import (
    ACTIONS,
    BULK_ACTIONS,
    OPERATE,
    PREVIEWS,
    ActionInput,
    Permission,
    budget_fields,
)
from .page import TRACE_REFRESH_MAX, SessionPage, live_throttle, steps_context
from .presenters import audit_details, audit_via, diff_states

PAGE_SIZE = 50


# --- Access -----------------------------------------------------------------------------


def _require_view(request: HtmxRequest) -> None:
    if not can_view(request.user):
        raise PermissionDenied("your account has no role here (viewer or operator)")


def _require_operate(request: HtmxRequest) -> None:
    _require(request, OPERATE)


def _get_session(request: HtmxRequest, session_id: UUID) -> AgentSession:
    """The session, if the user may see it; a 404 otherwise, whether it exists or not (a
    403 would tell another team's staff that the id is a session)."""
    _require_view(request)
    session = selectors.session_by_id(session_id, session_scope(request.user))
    if session is None:
        raise Http404("no such session")
    return session


def _require_operate_session(request: HtmxRequest, session: AgentSession) -> None:
    """Someone who reads the session (a team viewer) but may not change it."""
    if not can_operate_session(request.user, session):
        raise PermissionDenied("your role in this session's team does not act on sessions")


def _meta(request: HtmxRequest) -> dict[str, Any]:
    return request_meta(request, DASHBOARD)


def _fragment(
    request: HtmxRequest, template: str, context: dict[str, Any], *, title: str, target: str
) -> HttpResponse:
    """A fragment the page loads into `target`; opened by its own address (a link followed
    without JavaScript), the same inside a full page."""
    if request.htmx:
        return render(request, template, context)
    page = {
        **context,
        "fragment_template": template,
        "page_title": title,
        "fragment_id": target,
    }
    return render(request, "sessions/fragment_page.html", page)


def _error(request: HtmxRequest, text: str, status: int) -> HttpResponse:
    """An error an htmx request shows next to what the operator clicked (static/js reads
    the `data-error` text); a full page for anything else. (A request refused before
    django-htmx's middleware saw it is told by its header.)"""
    if getattr(request, "htmx", None) or request.headers.get("HX-Request") == "true":
        response = render(request, "sessions/error.html#fragment", {"text": text}, status=status)
        # Read by static/js from the header, so no page is ever parsed to find it.
        response["X-Respawn-Error"] = quote(text[:500])
        return response
    return render(request, "sessions/error.html", {"text": text, "status": status}, status=status)


# --- Session list -----------------------------------------------------------------------


def _list_context(request: HtmxRequest) -> dict[str, Any]:
    filters = selectors.SessionFilters.from_query(request.GET, request.user)
    cursor = request.GET.get("cursor") or None
    before = request.GET.get("before") or None
    position = positive_int(request.GET.get("pos"))
    try:
        page = selectors.session_page(filters, cursor, PAGE_SIZE, before=before, position=position)
    except selectors.BadFilter as exc:
        filters.errors.append(str(exc))
        page = selectors.session_page(filters, None, PAGE_SIZE, position=1)
    # Counted here only when the counts are cached; otherwise the counts fragment loads
    # them after the page (a GROUP BY over every session takes ~150 ms at 1,000,000) and
    # fills in the pager's total as it swaps in.
    totals = selectors.status_totals(filters, cached_only=True)
    end = page.start + len(page.rows) - 1 if page.rows else 0
    query = filters.as_query()
    here = filters.as_query(
        cursor=cursor if not before else None, before=before, pos=page.start or None
    )
    return {
        "sessions": page.rows,
        "page": page,
        "filters": filters,
        "query": query,
        "here": here,
        "next_query": filters.as_query(cursor=page.next_cursor, pos=end + 1)
        if page.next_cursor
        else None,
        "prev_query": filters.as_query(before=page.prev_cursor, pos=max(page.start - PAGE_SIZE, 1))
        if page.prev_cursor
        else None,
        "first_page": not page.prev_cursor,
        "position": {"start": page.start, "end": end},
        **_counts_context(filters, totals),
        "statuses": Status.choices,
        "agents": selectors.agent_names(filters.scope),
        "sorts": [
            ("-updated", "latest activity"),
            ("updated", "oldest activity"),
            ("-created", "newest"),
            ("created", "oldest"),
        ],
        "can_operate": can_operate(request.user),
        "now": timezone.now(),
        # Step ids the search index has not reached yet (steps are indexed off the append).
        "search_lag": search.lag() if filters.q else 0,
    }


def _counts_context(
    filters: selectors.SessionFilters, totals: selectors.StatusTotals | None
) -> dict[str, Any]:
    """The count chips, and the total the pager shows: None until counted."""
    context: dict[str, Any] = {
        "counts": None,
        "listed": None,
        "counts_query": filters.as_query(status=""),
        # The fragment is asked for with the status too: the pager's total is its count.
        "counts_url_query": filters.as_query(sort=""),
        "filters": filters,
    }
    if totals is not None:
        listed = totals.of(filters.status)
        context.update(
            {
                "counts": [(value, label, totals.counts[value]) for value, label in Status.choices],
                "total": totals.total,
                "counts_capped": totals.capped,
                "listed": {
                    "n": listed,
                    # Counts are cached for seconds; a search is counted up to a cap.
                    "about": listed >= 1000 and not totals.capped,
                    "capped": totals.capped,
                },
            }
        )
    return context


@login_required
@require_GET
def session_list(request: HtmxRequest) -> HttpResponse:
    _require_view(request)
    if not request.htmx and any(v == "" for _, values in request.GET.lists() for v in values):
        # A filter form sent without JavaScript sends every field: the address of the
        # list it asked for keeps only the filters that say something.
        kept = [(k, v) for k, values in request.GET.lists() for v in values if v != ""]
        return redirect(f"{request.path}?{urlencode(kept)}" if kept else request.path)
    context = _list_context(request)
    target = request.htmx.target if request.htmx else None
    template = {
        "results": "sessions/list.html#results",
        "rows": "sessions/list.html#rows",
    }.get(target or "", "sessions/list.html")
    return render(request, template, context)


@login_required
@require_GET
def status_counts(request: HtmxRequest) -> HttpResponse:
    """The count chips under the list's filters (polled, and redrawn when a row settles)."""
    _require_view(request)
    filters = selectors.SessionFilters.from_query(request.GET, request.user)
    totals = selectors.status_totals(filters, fresh=request.GET.get("fresh") == "1")
    context = {**_counts_context(filters, totals), "oob": True}
    return render(request, "sessions/list.html#counts", context)


@login_required
@require_GET
def session_row(request: HtmxRequest, session_id: UUID) -> HttpResponse:
    _require_view(request)
    session = selectors.session_by_id(session_id, session_scope(request.user))
    context = {
        "s": session,
        "gone_id": session_id,
        "can_operate": can_operate(request.user),
        "now": timezone.now(),
    }
    response = render(request, "sessions/list.html#row", context)
    if session is None or not session.is_runnable:
        # Settled (or deleted): render it once more, stop polling, and let the counts know.
        response.status_code = HttpResponseStopPolling.status_code
        trigger_client_event(response, "sessions-settled", after="swap")
    return response


@login_required
@require_POST
def bulk_action(request: HtmxRequest) -> HttpResponse:
    """One of actions.BULK_ACTIONS (the form's `action`) on the sessions selected in the
    list, or on every session its filters match (`scope=matching`): first a confirmation
    naming how many, then each session on its own, and a report."""
    bulk = BULK_ACTIONS.get(request.POST.get("action", ""))
    _require(request, bulk.permission if bulk else OPERATE)
    if bulk is None:
        return _error(request, f"unknown bulk action {request.POST.get('action', '')!r}", 400)
    if request.POST.get("scope") == "matching":
        return _bulk_matching(request, bulk)
    raw_ids = request.POST.getlist("ids")[: BULK_LIMIT + 1]
    if len(raw_ids) > BULK_LIMIT:
        return _error(
            request,
            f"at most {BULK_LIMIT} sessions at once by selection: select all matching the "
            "filters instead",
            400,
        )
    ids = [parse_uuid(raw) for raw in raw_ids]
    for raw, session_id in zip(raw_ids, ids, strict=True):
        if session_id is None:
            return _error(request, f"not a session id: {raw[:60]!r}", 400)
    sessions = selectors.sessions_by_ids(
        [i for i in ids if i is not None], session_scope(request.user)
    )
    if not sessions:
        return _error(request, "select at least one session first", 400)
    if request.POST.get("confirm") != "yes":
        return render(
            request,
            "sessions/bulk.html",
            {"action": bulk.name, "sessions": sessions, "preview": True},
        )
    results = []
    for index, session in enumerate(sessions):
        try:
            outcome = bulk.run_one(session, index, request.user, _meta(request))
            results.append((session, True, outcome))
        except services.ActionError as exc:
            results.append((session, False, str(exc)))
    done = sum(1 for _, ok, _ in results if ok)
    response = render(
        request,
        "sessions/bulk.html",
        {"action": bulk.name, "results": results, "done": done, "failed": len(results) - done},
    )
    if done:
        # The rows and the counts redraw themselves from the database.
        trigger_client_event(response, "sessions-changed", after="swap")
    return response


# A bulk action on every matching session goes a batch per request, each session in its
# own transaction through its service (audited one by one): a request stops after this
# many sessions or seconds, and the page posts the next batch from where it stopped.
BULK_BATCH = 500
BULK_BATCH_SECONDS = 5.0
BULK_REASONS = 20  # distinct refusal reasons a report keeps count of


@dataclass
class BulkTally:
    """Where a bulk action on matching sessions stands, carried from batch to batch."""

    total: int  # matching when the operator confirmed
    done: int = 0
    refused: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_form(cls, form: Any) -> BulkTally:
        tally = cls(
            total=positive_int(form.get("total")) or 0,
            done=positive_int(form.get("done")) or 0,
            refused=positive_int(form.get("refused")) or 0,
        )
        try:
            reasons = json.loads(form.get("reasons") or "{}")
        except ValueError:
            reasons = {}
        if isinstance(reasons, dict):
            tally.reasons = {
                str(k)[:300]: int(v)
                for k, v in list(reasons.items())[:BULK_REASONS]
                if isinstance(v, int) and v > 0
            }
        return tally

    def refuse(self, reason: str) -> None:
        self.refused += 1
        if reason in self.reasons or len(self.reasons) < BULK_REASONS:
            self.reasons[reason] = self.reasons.get(reason, 0) + 1

    @property
    def seen(self) -> int:
        return self.done + self.refused

    @property
    def reasons_json(self) -> str:
        return json.dumps(self.reasons)


def _bulk_matching(request: HtmxRequest, bulk: Any) -> HttpResponse:
    # The list's filters, carried as f.<name> (the bulk form sits beside the filter form).
    given = {k[2:]: v for k, v in request.POST.items() if k.startswith("f.")}
    filters = selectors.SessionFilters.from_query(given, request.user)
    if filters.errors:
        return _error(request, "; ".join(filters.errors), 400)
    context: dict[str, Any] = {
        "action": bulk.name,
        "scope": "matching",
        "filter_query": filters.as_query(),
        "described": _described(filters),
    }
    after = None
    if request.POST.get("after"):
        after = parse_uuid(request.POST["after"])
        if after is None:
            return _error(request, f"not a session id: {request.POST['after'][:60]!r}", 400)
    if request.POST.get("confirm") != "yes":
        total = selectors.matching_count(filters)
        if not total:
            return _error(request, "no session matches these filters", 400)
        return render(request, "sessions/bulk.html", {**context, "preview": True, "total": total})
    tally = BulkTally.from_form(request.POST)
    started = time.monotonic()
    rows, rest = selectors.matching_sessions(filters, after=after, size=BULK_BATCH)
    acted = []
    for session in rows:
        try:
            bulk.run_one(session, tally.seen, request.user, _meta(request))
            tally.done += 1
        except services.ActionError as exc:
            tally.refuse(str(exc))
        acted.append(session)
        if time.monotonic() - started > BULK_BATCH_SECONDS:
            break
    if acted and acted[-1] is not rows[-1]:
        rest = acted[-1].id  # stopped for time: the next batch starts after it
    response = render(
        request,
        "sessions/bulk.html",
        {**context, "tally": tally, "after": rest, "matching": True},
    )
    if acted:
        trigger_client_event(response, "sessions-changed", after="swap")
    return response


def _described(filters: selectors.SessionFilters) -> str:
    """The filters in words, for a confirmation: "status failed, agent demo"."""
    names = {
        "q": "search",
        "agent_version": "agent version",
        "created_from": "created from",
        "created_to": "created until",
        "updated_from": "updated from",
        "updated_to": "updated until",
    }
    query = filters.as_query(sort="")
    return (
        ", ".join(
            f"{names.get(k, k)} {v!r}" if k == "q" else f"{names.get(k, k)} {v}"
            for k, v in query.items()
        )
        or "no filter: every session"
    )


@login_required
@require_GET
def list_charts(request: HtmxRequest) -> HttpResponse:
    _require_view(request)
    span = request.GET.get("span", "24h")
    if span not in charts.SPANS:
        return _error(
            request, f"unknown span {span[:20]!r} (one of: {', '.join(charts.SPANS)})", 400
        )
    return _fragment(
        request,
        "sessions/charts.html",
        {
            "activity": charts.activity(span, session_scope(request.user)),
            "latency": charts.latency(span, session_scope(request.user)),
            "span": span,
            "spans": list(charts.SPANS),
        },
        title="Activity",
        target="charts",
    )


# --- Session detail ---------------------------------------------------------------------
# The page and each part it redraws take their context from page.SessionPage.


@login_required
@require_GET
def session_detail(request: HtmxRequest, session_id: UUID) -> HttpResponse:
    session = _get_session(request, session_id)
    page = SessionPage(request, session)
    if request.htmx and request.htmx.target == "trace":
        # The trace's own navigation (filters, jumps, the refresh after an action).
        return render(request, "sessions/detail.html#trace", page.context("trace"))
    return render(request, "sessions/detail.html", page.context("page"))


@login_required
@require_GET
def session_header(request: HtmxRequest, session_id: UUID) -> HttpResponse:
    """The header (polled while the session is live), the actions, or both; or the
    checkpoints or audit card (redrawn after an action, and as the session moves)."""
    session = _get_session(request, session_id)
    part = request.GET.get("part", "panel")
    if part not in ("panel", "header", "actions", "checkpoints", "audit"):
        raise Http404("no such part")
    response = render(
        request, f"sessions/detail.html#{part}", SessionPage(request, session).context(part)
    )
    if part == "header" and not session.is_runnable:
        # Settled: stop polling, and tell the actions to redraw for the new status.
        response.status_code = HttpResponseStopPolling.status_code
        trigger_client_event(response, "session-settled", after="swap")
    elif part == "header" and session.last_seq != positive_int(request.GET.get("seen")):
        # New steps since the header the page shows: the live parts (trace tail,
        # timeline, usage, checkpoints) follow this one poll, so none lags behind it.
        trigger_client_event(response, "session-moved", {"last_seq": session.last_seq})
    return response


@login_required
@require_GET
def session_steps(request: HtmxRequest, session_id: UUID) -> HttpResponse:
    """The next page of the trace after `after` (lazy load on scroll, and the live tail).
    The page before says how many turns and runs it showed, and the worker of its run."""
    session = _get_session(request, session_id)
    try:
        after = parse_int(request.GET.get("after", "0"), "after", maximum=999_999_999)
    except InvalidInput as exc:
        return _error(request, f"{exc} (a step number)", 400)
    filters = trace.TraceFilters.from_query(request.GET)
    # The live tail takes every step that arrived since (up to a bound), so the trace keeps
    # up with the header however fast the session runs; scrolling loads a page at a time.
    limit = TRACE_REFRESH_MAX if request.GET.get("live") == "1" else trace.TRACE_PAGE
    page = trace.trace_page(
        session, after=after, filters=filters, context=steps_context(request), limit=limit
    )
    if not page.views and not page.more and not session.is_runnable:
        # Caught up with a session that will not change: nothing to add, stop asking.
        return HttpResponseStopPolling()
    context = SessionPage(request, session).steps(page, filters, after=after)
    return render(request, "sessions/detail.html#steps", context)


@login_required
@require_GET
def session_timeline(request: HtmxRequest, session_id: UUID) -> HttpResponse:
    """The timeline: every step on an axis of active time; a long session as an overview,
    with a window of steps drawn one row each (`from`, `to`)."""
    session = _get_session(request, session_id)
    filters = trace.TraceFilters.from_query(request.GET)
    start, end = positive_int(request.GET.get("from")), positive_int(request.GET.get("to"))
    window = (start, end or start + trace.TIMELINE_WINDOW - 1) if start else None
    return _fragment(
        request,
        "sessions/timeline.html",
        {
            "session": session,
            "t": trace.timeline(session, filters, window=window),
            "tf": filters,
            "filter_query": filters.query(),
            "is_live": session.is_runnable,
            "live_throttle": live_throttle(session),
        },
        title="Timeline",
        target="timeline",
    )


@login_required
@require_GET
def session_usage(request: HtmxRequest, session_id: UUID) -> HttpResponse:
    """Tokens and cost per turn."""
    session = _get_session(request, session_id)
    filters = trace.TraceFilters.from_query(request.GET)
    return _fragment(
        request,
        "sessions/usage.html",
        {"session": session, "u": trace.usage_per_turn(session, filters), "tf": filters},
        title="Tokens and cost per turn",
        target="usage",
    )


@login_required
@require_GET
def checkpoint_diff(request: HtmxRequest, session_id: UUID) -> HttpResponse:
    session = _get_session(request, session_id)
    checkpoints = selectors.checkpoints_of(session)

    def pick(raw: str | None, default: Checkpoint | None) -> Checkpoint | None:
        if raw is None or raw in ("", "head"):
            return session.head_checkpoint() if raw == "head" else default
        try:
            pk = parse_int(raw, "checkpoint", maximum=2**63 - 1)
        except InvalidInput:
            return None
        return selectors.checkpoint_by_id(session, pk)

    first = checkpoints[0] if checkpoints else None
    a = pick(request.GET.get("a"), first)
    b = pick(request.GET.get("b") or "head", None)
    error = None
    lines = []
    if a is None or b is None:
        error = "pick two checkpoints of this session"
    else:
        # Both sides at the current schema, so a diff across an upgrade shows real changes.
        lines = diff_states(selectors.upgraded_state(a.state), selectors.upgraded_state(b.state))
    if error and checkpoints and request.htmx:
        return _error(request, error, 400)
    context = {
        "session": session,
        "checkpoints": checkpoints,
        "a": a,
        "b": b,
        "lines": lines,
        "error": error,
        "steps_between": selectors.steps_between(session, a.seq, b.seq) if a and b else 0,
    }
    template = "sessions/diff.html#diff" if request.htmx else "sessions/diff.html"
    return render(request, template, context, status=400 if error and checkpoints else 200)


# --- Previews and actions ---------------------------------------------------------------
# Which actions there are, who may take them and what each does: actions.ACTIONS. One
# view serves them all, so access, errors and the redraw are the same for every one.


def _require(request: HtmxRequest, permission: Permission) -> None:
    if not permission.allows(request.user):
        raise PermissionDenied(permission.refusal)


@login_required
@require_GET
def action_preview(request: HtmxRequest, session_id: UUID, action: str) -> HttpResponse:
    """What an action will do, with the button that confirms it (resume, roll back)."""
    session = _get_session(request, session_id)
    previewed = PREVIEWS[action]  # the URL admits no other name
    _require(request, previewed.permission)
    if previewed.permission == OPERATE:
        _require_operate_session(request, session)
    assert previewed.preview is not None
    try:
        preview = previewed.preview(session, request.GET)
    except services.ActionError as exc:
        return _error(request, str(exc), exc.status)
    return render(request, "sessions/preview.html", {"session": session, "preview": preview})


def _action_response(
    request: HtmxRequest, session: AgentSession, *, ok: bool, text: str, status: int = 200
) -> HttpResponse:
    """After an action: the panel redrawn with the outcome, and the trace and timeline told
    to redraw in place. A refused action keeps the form as the operator filled it and says
    why next to it (an htmx request), or on the page it redirects to."""
    if not request.htmx:
        (messages.success if ok else messages.error)(request, text)
        return redirect("sessions:detail", session_id=session.id)
    if not ok:
        return _error(request, text, status)
    messages.success(request, text)
    session.refresh_from_db()
    response = render(
        request,
        "sessions/detail.html#panel",
        SessionPage(request, session).context("panel"),
        status=status,
    )
    trigger_client_event(response, "trace-changed", after="swap")
    trigger_client_event(response, "respawn-notice", {"text": text}, after="swap")
    return response


@login_required
@require_POST
def session_action(request: HtmxRequest, session_id: UUID, action: str) -> HttpResponse:
    """Take one of actions.ACTIONS on the session (its `run` reads the form and calls the
    service, which enforces the status policy under the session's lock)."""
    session = _get_session(request, session_id)
    taken = ACTIONS[action]  # the URL admits no other name
    _require(request, taken.permission)
    if taken.permission == OPERATE:
        _require_operate_session(request, session)
    given = ActionInput(session=session, form=request.POST, actor=request.user, meta=_meta(request))
    try:
        done = taken.run(given)
    except services.ActionError as exc:
        return _action_response(request, session, ok=False, text=str(exc), status=exc.status)
    if done.goto:
        messages.success(request, done.text)
        return HttpResponseClientRedirect(done.goto) if request.htmx else redirect(done.goto)
    return _action_response(request, session, ok=True, text=done.text)


@login_required
@require_GET
def operators(request: HtmxRequest, session_id: UUID) -> HttpResponse:
    """Whom this session may be handed to: the <option>s of the hand form's suggestions,
    loaded when the form is opened (not with every session page). Everyone who may act on
    the session, whether by a global role or in the team that owns its agent. Anyone who
    reads the session may read it: the pages show every owner's name to viewers too."""
    session = _get_session(request, session_id)
    return render(
        request,
        "sessions/detail.html#operators",
        {"operators": selectors.operator_names(session.agent)},
    )


# --- Audit log and attention ------------------------------------------------------------


@login_required
@require_GET
def audit_log(request: HtmxRequest) -> HttpResponse:
    _require_view(request)
    actor = (request.GET.get("actor") or "").strip()
    action = (request.GET.get("action") or "").strip()
    session_q = (request.GET.get("session") or "").strip()
    error = None
    session_id = parse_uuid(session_q)
    session_ids = None
    before = None
    try:
        if session_q and session_id is None:
            session_ids = parse_uuid_prefix(session_q)  # the start of an id
        if request.GET.get("before"):
            before = parse_int(request.GET["before"], "before", maximum=2**63 - 1)
    except InvalidInput as exc:
        error = str(exc)
    if action and action not in AuditAction.values:
        error = f"unknown action {action[:50]!r}"
    page: list[Any] = []
    more = False
    if error is None:  # a filter that cannot apply shows nothing, never every row
        page, more = selectors.audit_page(
            actor=actor,
            action=action,
            session_id=session_id,
            session_ids=session_ids,
            before=before,
            size=PAGE_SIZE,
            scope=session_scope(request.user),
            token_teams=administered_teams(request.user),
        )
    query = {k: v for k, v in {"actor": actor, "action": action, "session": session_q}.items() if v}
    return render(
        request,
        "sessions/audit.html",
        {
            "events": page,
            "rows": [
                (e, audit_details(e.before, e.after), audit_via(e.request_meta)) for e in page
            ],
            "next_query": {**query, "before": page[-1].id} if more and page else None,
            "query": query,
            "error": error,
            "actions": AuditAction.choices,
        },
        status=400 if error else 200,
    )


# --- Starting a session -----------------------------------------------------------------

MAX_TITLE = 300  # as the API's
BUDGET_INPUTS = (  # the form's budget fields: name, label, inputmode
    ("max_steps", "Steps", "numeric"),
    ("max_tokens", "Tokens", "numeric"),
    ("max_cost", "Cost ($)", "decimal"),
    ("max_seconds", "Wall time (s)", "decimal"),
)


@login_required
def session_new(request: HtmxRequest) -> HttpResponse:
    """Start a session (operators): an agent, its input, a title and budgets, checked by
    the service the API starts sessions with; a refusal is shown beside the field it is
    about, with what was typed kept."""
    _require_view(request)
    _require_operate(request)
    agents = selectors.startable_agents(operate_scope(request.user))
    form = {
        "agent": request.POST.get("agent", request.GET.get("agent", "")),
        "input": request.POST.get("input", ""),
        "title": request.POST.get("title", ""),
        **{name: request.POST.get(name, "") for name in services.BUDGET_FIELDS},
    }
    errors: dict[str, str] = {}
    if request.method == "POST":
        try:
            title = form["title"].strip()
            if any(char in title for char in "\r\n"):
                raise services.ActionError("title: one line, please", field="title")
            if len(title) > MAX_TITLE:
                raise services.ActionError(
                    f"title: at most {MAX_TITLE} characters (got {len(title)})", field="title"
                )
            budgets = budget_fields(request.POST)
            session = services.session_start(
                agent=form["agent"],
                input=form["input"],
                title=title,
                budgets=budgets or None,
                actor=request.user,
                request_meta=_meta(request),
            )
        except services.ActionError as exc:
            errors[exc.field or "form"] = str(exc)
        else:
            messages.success(request, f"Started: a {session.agent} session, queued for a worker.")
            return redirect("sessions:detail", session_id=session.id)
    elif request.method != "GET":
        return HttpResponse(status=405)
    return render(
        request,
        "sessions/new.html",
        {
            "agents": agents,
            "form": form,
            "errors": errors,
            "max_input": services.MAX_INPUT_CHARS,
            "max_title": MAX_TITLE,
            "budget_inputs": [
                {"name": name, "label": label, "mode": mode, "value": form[name]}
                for name, label, mode in BUDGET_INPUTS
            ],
        },
        status=400 if errors else 200,
    )


# --- Export and import ------------------------------------------------------------------


@login_required
@require_POST
def session_export(request: HtmxRequest, session_id: UUID) -> HttpResponse:
    """The session as a file (viewers may export: it is what they can read anyway). A POST:
    an export is an action, audited, and not for a link a page may prefetch or a GET that
    another site may make a logged-in browser send."""
    from ..upkeep.transfer import export_bytes

    session = _get_session(request, session_id)
    data = export_bytes(session, actor=request.user, request_meta=_meta(request))
    response = HttpResponse(data, content_type="application/gzip")
    response["Content-Disposition"] = f'attachment; filename="session-{session.id}.jsonl.gz"'
    return response


MAX_IMPORT_BYTES = 64 * 1024 * 1024  # through the browser; bigger files: manage.py import_session


@login_required
def session_import(request: HtmxRequest) -> HttpResponse:
    """Upload an export (operators): checked whole, then written at once, or not at all."""
    from ..upkeep.transfer import TransferError, import_session

    _require_view(request)
    _require_operate(request)
    error = ""
    if request.method == "POST":
        upload = request.FILES.get("file")
        if upload is None:
            error = "choose an exported session file (.jsonl.gz)"
        elif (upload.size or 0) > MAX_IMPORT_BYTES:
            error = (
                f"the file is larger than {MAX_IMPORT_BYTES // 2**20} MB: "
                "use python manage.py import_session"
            )
        else:
            try:
                result = import_session(
                    upload.read(),
                    new_ids=request.POST.get("new_ids") == "1",
                    actor=request.user,
                    request_meta=_meta(request),
                )
            except TransferError as exc:
                error = str(exc)
            else:
                messages.success(
                    request,
                    f"Imported: {result.steps} steps, {result.checkpoints} checkpoints, "
                    f"{result.audit} imported audit records"
                    + (
                        f" (a new id; it was {result.remapped_from})"
                        if result.remapped_from
                        else ""
                    ),
                )
                return redirect("sessions:detail", session_id=result.session.id)
    elif request.method != "GET":
        return HttpResponse(status=405)
    return render(request, "sessions/import.html", {"error": error}, status=400 if error else 200)


@login_required
@require_GET
def agents(request: HtmxRequest) -> HttpResponse:
    """The agents this deployment runs, their tools, and their live sessions per version."""
    _require_view(request)
    return render(
        request,
        "sessions/agents.html",
        {
            "overview": selectors.agents_overview(session_scope(request.user)),
            "model_override": settings.RESPAWN_MODEL,
        },
    )


COST_WINDOW_DAYS = 30


@login_required
@require_GET
def costs(request: HtmxRequest) -> HttpResponse:
    """What model calls cost: by day, agent or model, over a window of days (the last
    COST_WINDOW_DAYS by default), with the totals; kept when sessions are deleted."""
    _require_view(request)
    group = request.GET.get("group", "day")
    today = timezone.now().date()
    error = None
    try:
        since = parse_date(request.GET["since"], "since") if request.GET.get("since") else None
        until = parse_date(request.GET["until"], "until") if request.GET.get("until") else None
        if since is None:
            since = (until or today) - timedelta(days=COST_WINDOW_DAYS - 1)
        rows, total = selectors.usage_totals(
            group=group,
            since=since,
            until=until,
            agent=request.GET.get("agent") or None,
            scope=session_scope(request.user),
        )
    except (InvalidInput, selectors.BadFilter) as exc:
        error, rows, total, since, until = str(exc), [], {}, None, None
        group = "day"
    peak = max((row["cost"] for row in rows), default=0) or 1
    for row in rows:
        row["share"] = round(row["cost"] * 100 / peak)
    return render(
        request,
        "sessions/costs.html",
        {
            "group": group,
            "groups": list(selectors.USAGE_GROUPS),
            "rows": rows,
            "total": total,
            "since": since,
            "until": until or today,
            "agent": request.GET.get("agent", ""),
            "error": error,
            "prices_overridden": bool(settings.RESPAWN_PRICES),
        },
        status=400 if error else 200,
    )


@login_required
@require_GET
def attention(request: HtmxRequest) -> HttpResponse:
    """Sessions a person should look at, in sections, each paged on its own (`?<key>=cursor`);
    an htmx request for one section (`?section=key`) gets just that section."""
    _require_view(request)
    scope = session_scope(request.user)
    now = database_clock()  # leases and updates are stamped on the database's clock
    errors = []
    sections = {}
    # The work queue: mine (owner=me), nobody's (owner=unassigned) or someone's.
    owner = (request.GET.get("owner") or "").strip()
    owned: Q | None = None
    if owner:
        try:
            owned = selectors.owner_q(selectors.owner_id(owner, request.user))
        except selectors.BadFilter as exc:
            errors.append(str(exc))
            owner = ""
    only = request.GET.get("section") or ""
    # htmx asks for one section (its next page); a browser that opens that address itself
    # (a new tab, no script) gets the whole page, that section at the page asked for.
    one = bool(only in selectors.ATTENTION_SECTIONS and request.htmx)
    keys = [only] if one else list(selectors.ATTENTION_SECTIONS)
    for key in keys:
        try:
            sections[key] = selectors.attention_section(
                key, cursor=request.GET.get(key), now=now, owner=owned, scope=scope
            )
        except selectors.BadFilter as exc:
            errors.append(f"{key}: {exc}")
            sections[key] = selectors.attention_section(key, now=now, owner=owned, scope=scope)
    context = {
        "owner": owner,
        "owner_query": f"owner={quote(owner)}&" if owner else "",
        "sections": list(sections.values()),
        "errors": errors,
        "can_operate": can_operate(request.user),
        "now": now,
    }
    if one:
        extra: dict[str, Any] = {}
        if only == "failed":
            extra["failures"] = selectors.repeated_failures(scope=scope)
        if only == "incompatible":
            extra["old_schema"] = selectors.old_schema_sessions(scope=scope)
        return render(
            request,
            "sessions/attention.html#section",
            {**context, **extra, "sec": sections[only]},
        )
    counts = selectors.status_counts(scope)
    activity = selectors.activity_last_24h(scope)
    context.update(
        {
            "stuck": sections["stuck"].rows,
            "approvals": sections["approvals"].rows,
            "uncertain": sections["uncertain"].rows,
            "incompatible": sections["incompatible"].rows,
            "failures": selectors.repeated_failures(scope=scope),
            "old_schema": selectors.old_schema_sessions(scope=scope),
            "counts": [(value, label, counts[value]) for value, label in Status.choices],
            "chart": charts.activity_chart(activity),
        }
    )
    return render(request, "sessions/attention.html", context)


# --- Error pages ------------------------------------------------------------------------
# Styled like every other page, and for an htmx request a fragment the page shows next to
# what was clicked: never Django's bare pages swapped into the middle of the dashboard.


def permission_denied(request: HtmxRequest, exception: Exception) -> HttpResponse:
    text = str(exception) or "you are not allowed to do this"
    return _error(request, f"Refused: {text}", 403)


def page_not_found(request: HtmxRequest, exception: Exception) -> HttpResponse:
    # A view's own 404 says what is missing ("no such session"); an address that matches
    # no URL carries the resolver's internals, which are not for the page.
    said = isinstance(exception, Http404) and not isinstance(exception, Resolver404)
    text = str(exception) if said and exception.args else ""
    return _error(request, f"Not found: {text or 'nothing lives at this address'}", 404)


def bad_request(request: HtmxRequest, exception: Exception) -> HttpResponse:
    # What the input guard refused is named (BadRequest), and so is a body or form over
    # the limits; anything else Django refuses (a suspicious host or header) is not
    # repeated back. The API's clients get JSON, as from every other refusal of the API.
    if isinstance(exception, BadRequest) and exception.args:
        text = str(exception)
    elif isinstance(exception, RequestDataTooBig):
        text = f"the request body is over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE:,} bytes"
    elif isinstance(exception, TooManyFieldsSent):
        text = f"the form has over {settings.DATA_UPLOAD_MAX_NUMBER_FIELDS:,} fields"
    else:
        text = "the server could not read what was sent"
    if request.path_info.startswith("/api/"):
        return JsonResponse({"error": "bad_request", "detail": text}, status=400)
    return _error(request, f"Bad request: {text}", 400)


def server_error(request: HtmxRequest) -> HttpResponse:
    # No database, no session, no user: whatever failed may fail again here. Called while
    # the exception is being handled: a database outage met outside a view (a middleware)
    # is a 503, as the middleware makes it in views.
    from ..web.middleware import database_unavailable, unavailable_response

    met = sys.exc_info()[1]
    if database_unavailable(met):
        return unavailable_response(request, met)
    return render(request, "500.html", status=500, context={})


def csrf_failure(request: HtmxRequest, reason: str = "") -> HttpResponse:
    return _error(
        request,
        "Refused: this form's security token is missing or expired. Reload the page and "
        "try again (nothing was changed).",
        403,
    )


# --- Prometheus ------------------------------------------------------------------------


@never_cache
@require_GET
def metrics(request: HtmxRequest) -> HttpResponse:
    """The deployment's metrics for Prometheus (sessions_app.telemetry). Scraped with
    `Authorization: Bearer <RESPAWN_METRICS_TOKEN>` or an API token of a user who may view
    sessions; a logged-in viewer may read it in a browser. The metrics count every team's
    sessions: only someone who reads every session (a global role) gets them."""
    from prometheus_client import CONTENT_TYPE_LATEST

    from .metrics import deployment_metrics

    if request.user.is_authenticated and not sees_every_team(request.user):
        raise PermissionDenied("metrics are for users who may view every team's sessions")
    if bearer_token(request) is not None and credentials.locked(request):
        response = HttpResponse(
            "too many wrong credentials from this address: try again later\n",
            status=429,
            content_type="text/plain",
        )
        response["Retry-After"] = str(credentials.retry_after())
        return response
    may, refused = _may_scrape(request)
    if not may:
        response = HttpResponse(
            f"{refused}: send a valid token\n"
            if refused
            else "metrics need a bearer token (RESPAWN_METRICS_TOKEN or an API token)\n",
            status=401,
            content_type="text/plain",
        )
        response["WWW-Authenticate"] = 'Bearer realm="respawn metrics"'
        return response
    return HttpResponse(deployment_metrics(), content_type=CONTENT_TYPE_LATEST)


def _may_scrape(request: HtmxRequest) -> tuple[bool, str | None]:
    """Whether the request may read the metrics, and why a real token it sent may not."""
    from hmac import compare_digest

    if request.user.is_authenticated and sees_every_team(request.user):
        return True, None
    token = bearer_token(request)
    if token is None:
        return False, None
    configured = settings.RESPAWN_METRICS_TOKEN
    if configured and compare_digest(configured.encode(), token.encode()):
        return True, None
    found, refused = selectors.api_token(token)
    if found is None:
        if refused is None:  # a real token no longer valid is not a guess (as in the API)
            credentials.failed(request, credentials.METRICS_TOKEN)
        return False, refused
    scraper = with_token(found.user, found)
    if can_view(scraper) and not sees_every_team(scraper):
        # A good token that reads one team's sessions (a team token, or a team member's):
        # a refusal that says why, not a 401 asking for the token that was given.
        raise PermissionDenied("metrics are for API tokens that may view every team's sessions")
    return sees_every_team(scraper), None
