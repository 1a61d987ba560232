"""The operator dashboard. Function views; one view serves a page and its fragments
(`template.html#partial` when the request comes from htmx); links keep their hrefs so
reading works without JavaScript; mutations are POST only and go through `services`."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import (
    HttpResponseClientRedirect,
    HttpResponseStopPolling,
    trigger_client_event,
)

from . import search, selectors, services
from .models import FINAL, RUNNABLE, AgentSession, AuditEvent, Checkpoint, Status, Step
from .permissions import can_operate, can_view
from .presenters import branch_label, diff_states, present_step
from .validation import InvalidInput, load_json, parse_int, request_meta

PAGE_SIZE = 50
TRACE_PAGE = 50
WATERFALL_STEPS = 400
BULK_LIMIT = 1000
LIVE_POLL = "2s"


# --- Access -----------------------------------------------------------------------------


def _require_view(request: HttpRequest) -> None:
    if not can_view(request.user):
        raise PermissionDenied("your account has no role here (viewer or operator)")


def _require_operate(request: HttpRequest) -> None:
    if not can_operate(request.user):
        raise PermissionDenied("only operators can change sessions")


def _get_session(request: HttpRequest, session_id: UUID) -> AgentSession:
    _require_view(request)
    session = AgentSession.objects.select_related("parent").filter(id=session_id).first()
    if session is None:
        raise Http404("no such session")
    return session


def _meta(request: HttpRequest) -> dict[str, Any]:
    return request_meta(request, "dashboard")


def _is_live(session: AgentSession) -> bool:
    return session.status in RUNNABLE


# --- Session list -----------------------------------------------------------------------


@login_required
@require_GET
def session_list(request: HttpRequest) -> HttpResponse:
    _require_view(request)
    filters = selectors.SessionFilters.from_query(request.GET)
    cursor = request.GET.get("cursor") or None
    try:
        rows, next_cursor = selectors.session_page(filters, cursor, PAGE_SIZE)
    except selectors.BadFilter as exc:
        filters.errors.append(str(exc))
        rows, next_cursor = selectors.session_page(filters, None, PAGE_SIZE)
    now = timezone.now()
    context = {
        "sessions": rows,
        "filters": filters,
        "query": filters.as_query(),
        "next_query": filters.as_query(cursor=next_cursor) if next_cursor else None,
        "first_page": cursor is None,
        "statuses": Status.choices,
        "agents": selectors.agent_names(),
        "sorts": [
            ("-updated", "latest activity"),
            ("updated", "oldest activity"),
            ("-created", "newest"),
            ("created", "oldest"),
        ],
        "can_operate": can_operate(request.user),
        "now": now,
        "live_statuses": [s.value for s in RUNNABLE],
        # Step ids the search index has not reached yet (steps are indexed off the append).
        "search_lag": search.lag() if filters.q else 0,
    }
    template = (
        "sessions/list.html#results"
        if request.htmx and request.htmx.target == "results"
        else "sessions/list.html"
    )
    return render(request, template, context)


@login_required
@require_GET
def status_counts(request: HttpRequest) -> HttpResponse:
    _require_view(request)
    counts = selectors.status_counts()
    return render(
        request,
        "sessions/list.html#counts",
        {
            "counts": [(value, label, counts[value]) for value, label in Status.choices],
            "total": sum(counts.values()),
            "query": selectors.SessionFilters.from_query(request.GET).as_query(),
        },
    )


@login_required
@require_GET
def session_row(request: HttpRequest, session_id: UUID) -> HttpResponse:
    session = _get_session(request, session_id)
    response = render(
        request,
        "sessions/list.html#row",
        {
            "s": session,
            "can_operate": can_operate(request.user),
            "live_statuses": [s.value for s in RUNNABLE],
        },
    )
    if not _is_live(session):
        # Final or waiting: render it once more, then stop polling.
        response.status_code = HttpResponseStopPolling.status_code
    return response


@login_required
@require_POST
def bulk_action(request: HttpRequest) -> HttpResponse:
    _require_operate(request)
    action = request.POST.get("action", "")
    if action not in ("resume", "cancel"):
        return render(
            request, "sessions/bulk.html", {"error": f"unknown bulk action {action!r}"}, status=400
        )
    raw_ids = request.POST.getlist("ids")[: BULK_LIMIT + 1]
    if len(raw_ids) > BULK_LIMIT:
        return render(
            request,
            "sessions/bulk.html",
            {"error": f"at most {BULK_LIMIT} sessions at once"},
            status=400,
        )
    ids = []
    for raw in raw_ids:
        try:
            ids.append(UUID(raw))
        except ValueError:
            return render(
                request, "sessions/bulk.html", {"error": f"not a session id: {raw!r}"}, status=400
            )
    sessions = list(AgentSession.objects.filter(id__in=ids).order_by("-updated_at"))
    if not sessions:
        return render(
            request, "sessions/bulk.html", {"error": "select at least one session"}, status=400
        )
    if request.POST.get("confirm") != "yes":
        return render(
            request, "sessions/bulk.html", {"action": action, "sessions": sessions, "preview": True}
        )
    results = []
    for index, session in enumerate(sessions):
        try:
            if action == "resume":
                outcome = services.session_resume_in_bulk(
                    session_id=session.id,
                    position=index,
                    actor=request.user,
                    request_meta=_meta(request),
                )
            else:
                services.session_cancel(
                    session_id=session.id, actor=request.user, request_meta=_meta(request)
                )
                outcome = "cancelled"
            results.append((session, True, outcome))
        except services.ActionError as exc:
            results.append((session, False, str(exc)))
    done = sum(1 for _, ok, _ in results if ok)
    return render(
        request,
        "sessions/bulk.html",
        {"action": action, "results": results, "done": done, "failed": len(results) - done},
    )


# --- Session detail ---------------------------------------------------------------------


def _trace_page(session: AgentSession, after: int, show_superseded: bool, limit: int = TRACE_PAGE):
    steps = Step.objects.filter(session=session, seq__gt=after).order_by("seq")
    if not show_superseded:
        steps = steps.filter(superseded_at__isnull=True)
    page = list(steps[: limit + 1])
    more = len(page) > limit
    page = page[:limit]
    seqs = [s.seq for s in page]
    reasons: dict[int, list[str]] = {}
    if seqs:
        for seq, reason in Checkpoint.objects.filter(
            session=session, seq__gte=seqs[0], seq__lte=seqs[-1]
        ).values_list("seq", "reason"):
            reasons.setdefault(seq, []).append(reason)
    views = [present_step(s, reasons.get(s.seq)) for s in page]
    return views, more, (seqs[-1] if seqs else after)


def _graph_interrupts(session: AgentSession) -> list[dict[str, Any]]:
    if session.status != Status.WAITING_INPUT:
        return []
    from .graph_services import pending_interrupts

    return pending_interrupts(session)


def _detail_context(
    request: HttpRequest, session: AgentSession, part: str = "page"
) -> dict[str, Any]:
    """What the page (or one of its parts: panel, header, actions) needs, and no more:
    each part is polled or re-rendered on its own, and a 100,000-step trace must not make
    a header refresh slow."""
    operate = can_operate(request.user)
    state = selectors.head_state(session)
    context: dict[str, Any] = {
        "session": session,
        "state": state,
        "can_operate": operate,
        "is_live": _is_live(session),
        "live_poll": LIVE_POLL,
        "duration": (session.updated_at - session.created_at) if session.updated_at else None,
        "schema_version": state.get("schema_version"),
        "model": _model_name(session),
        "pending": state.get("pending_approval")
        if session.status == Status.WAITING_INPUT
        else None,
        "uncertain": selectors.uncertain_call(session, state),
        # A LangGraph session stopped in interrupt(): what the graph asked.
        "interrupts": _graph_interrupts(session),
    }
    if part in ("page", "panel", "actions") and operate:
        context["tool_results"] = list(
            Step.objects.filter(session=session, kind="tool_result", superseded_at__isnull=True)
            .order_by("-seq")
            .values_list("seq", "payload__name")[:50]
        )
    if part != "page":
        return context
    show_superseded = request.GET.get("superseded") == "1"
    start = request.GET.get("from")
    try:
        after = max(parse_int(start, "from") - 1, 0) if start else 0
    except InvalidInput:
        after = 0  # a broken link to a step: the trace from its start
    steps, more, last = _trace_page(session, after, show_superseded)
    checkpoints = selectors.checkpoints_of(session)
    context.update(
        {
            "steps": steps,
            "more": more,
            "last_seq_shown": last,
            "show_superseded": show_superseded,
            "superseded_count": Step.objects.filter(
                session=session, superseded_at__isnull=False
            ).count(),
            "from_seq": after + 1 if after else None,
            "first_error": selectors.first_error_seq(session),
            "latest_from": max(session.last_seq - TRACE_PAGE + 1, 1),
            "checkpoints": checkpoints,
            "audit": list(AuditEvent.objects.filter(session=session).order_by("-created_at")[:20]),
        }
    )
    return context


def _model_name(session: AgentSession) -> str:
    if settings.RESPAWN_MODEL:
        return settings.RESPAWN_MODEL
    try:
        from .runtime import agent_registry

        return agent_registry().get(session.agent).model
    except KeyError:
        return "unknown agent"


@login_required
@require_GET
def session_detail(request: HttpRequest, session_id: UUID) -> HttpResponse:
    session = _get_session(request, session_id)
    return render(request, "sessions/detail.html", _detail_context(request, session))


@login_required
@require_GET
def session_header(request: HttpRequest, session_id: UUID) -> HttpResponse:
    """The header (polled while the session is live), the actions, or both."""
    session = _get_session(request, session_id)
    part = request.GET.get("part", "panel")
    if part not in ("panel", "header", "actions"):
        raise Http404("no such part")
    response = render(
        request, f"sessions/detail.html#{part}", _detail_context(request, session, part)
    )
    if part == "header" and not _is_live(session):
        # Settled: stop polling, and tell the actions to redraw for the new status.
        response.status_code = HttpResponseStopPolling.status_code
        trigger_client_event(response, "session-settled", after="swap")
    return response


@login_required
@require_GET
def session_steps(request: HttpRequest, session_id: UUID) -> HttpResponse:
    """The next page of the trace after `after` (lazy load on scroll, and the live tail)."""
    session = _get_session(request, session_id)
    try:
        after = parse_int(request.GET.get("after", "0"), "after")
    except InvalidInput as exc:
        return HttpResponse(f"{exc} (a step number)", status=400)
    show_superseded = request.GET.get("superseded") == "1"
    steps, more, last = _trace_page(session, after, show_superseded)
    if not steps and not more and not _is_live(session):
        # Caught up with a session that will not change: nothing to add, stop asking.
        return HttpResponseStopPolling()
    return render(
        request,
        "sessions/detail.html#steps",
        {
            "session": session,
            "steps": steps,
            "more": more,
            "last_seq_shown": last,
            "show_superseded": show_superseded,
            "can_operate": can_operate(request.user),
            "is_live": _is_live(session),
            "live_poll": LIVE_POLL,
        },
    )


@login_required
@require_GET
def session_waterfall(request: HttpRequest, session_id: UUID) -> HttpResponse:
    session = _get_session(request, session_id)
    return render(
        request, "sessions/waterfall.svg", _waterfall(session), content_type="image/svg+xml"
    )


def _waterfall(session: AgentSession) -> dict[str, Any]:
    steps = list(
        Step.objects.filter(session=session, superseded_at__isnull=True, started_at__isnull=False)
        .order_by("seq")
        .only("seq", "kind", "payload", "started_at", "finished_at")[:WATERFALL_STEPS]
    )
    width, label_w, row_h = 900, 190, 16
    if not steps:
        return {
            "bars": [],
            "width": width,
            "height": 40,
            "label_w": label_w,
            "ticks": [],
            "empty": True,
        }
    t0 = min(s.started_at for s in steps)
    t1 = max((s.finished_at or s.started_at) for s in steps)
    span = max((t1 - t0).total_seconds(), 0.001)
    scale = (width - label_w - 10) / span
    bars = []
    for row, s in enumerate(steps):
        start = (s.started_at - t0).total_seconds()
        dur = max(((s.finished_at or s.started_at) - s.started_at).total_seconds(), 0.0)
        name = s.payload.get("name") or s.payload.get("event") or ""
        bars.append(
            {
                "y": 20 + row * row_h,
                "x": label_w + start * scale,
                "w": max(dur * scale, 1.5),
                "kind": s.kind,
                # Branches of one fan-out overlap in time: their bars run side by side.
                "branch": branch_label(s.kind, s.payload),
                "label": f"#{s.seq} {s.kind} {name}"[:32],
                "title": f"#{s.seq} {s.kind} {name}: {dur * 1000:.1f} ms",
            }
        )
    ticks = [
        {"x": label_w + (span * i / 4) * scale, "label": f"{span * i / 4:.2f}s"} for i in range(5)
    ]
    return {
        "bars": bars,
        "width": width,
        "height": 30 + len(steps) * row_h,
        "label_w": label_w,
        "ticks": ticks,
        "truncated": session.last_seq > WATERFALL_STEPS,
        "empty": False,
    }


@login_required
@require_GET
def checkpoint_diff(request: HttpRequest, session_id: UUID) -> HttpResponse:
    session = _get_session(request, session_id)
    checkpoints = selectors.checkpoints_of(session)

    def pick(raw: str | None, default: Checkpoint | None) -> Checkpoint | None:
        if raw in (None, "", "head"):
            return (
                Checkpoint.objects.filter(session=session, seq=session.head).order_by("-id").first()
                if raw == "head"
                else default
            )
        try:
            pk = parse_int(raw, "checkpoint", maximum=2**63 - 1)
            return Checkpoint.objects.get(session=session, pk=pk)
        except (InvalidInput, Checkpoint.DoesNotExist):
            return None

    first = checkpoints[0] if checkpoints else None
    a = pick(request.GET.get("a"), first)
    b = pick(request.GET.get("b") or "head", None)
    error = None
    lines = []
    if a is None or b is None:
        error = "pick two checkpoints of this session"
    else:
        a = Checkpoint.objects.get(pk=a.pk)
        b = Checkpoint.objects.get(pk=b.pk)
        # Both sides at the current schema, so a diff across an upgrade shows real changes.
        lines = diff_states(selectors.upgraded_state(a.state), selectors.upgraded_state(b.state))
    context = {
        "session": session,
        "checkpoints": checkpoints,
        "a": a,
        "b": b,
        "lines": lines,
        "error": error,
        "steps_between": (
            Step.objects.filter(
                session=session, seq__gt=min(a.seq, b.seq), seq__lte=max(a.seq, b.seq)
            ).count()
            if a and b
            else 0
        ),
    }
    template = "sessions/diff.html#diff" if request.htmx else "sessions/diff.html"
    return render(request, template, context, status=400 if error and checkpoints else 200)


# --- Previews and actions ---------------------------------------------------------------


@login_required
@require_GET
def action_preview(request: HttpRequest, session_id: UUID, action: str) -> HttpResponse:
    session = _get_session(request, session_id)
    _require_operate(request)
    if action == "resume":
        preview = selectors.preview_resume(session)
    elif action == "rollback":
        try:
            seq = parse_int(request.GET.get("seq", ""), "seq")
        except InvalidInput:
            return render(
                request,
                "sessions/preview.html",
                {"session": session, "error": "choose a checkpoint"},
                status=400,
            )
        preview = selectors.preview_rollback(session, seq)
    else:
        raise Http404("no preview for that action")
    return render(request, "sessions/preview.html", {"session": session, "preview": preview})


def _action_response(
    request: HttpRequest, session: AgentSession, *, ok: bool, text: str, status: int = 200
) -> HttpResponse:
    (messages.success if ok else messages.error)(request, text)
    if not request.htmx:
        return redirect("sessions:detail", session_id=session.id)
    session.refresh_from_db()
    response = render(
        request,
        "sessions/detail.html#panel",
        _detail_context(request, session, "panel"),
        status=status,
    )
    if ok:
        trigger_client_event(response, "trace-changed", after="swap")
    return response


ACTION_STATUS = {"not_found": 404, "bad_status": 409, "already_running": 409}


@login_required
@require_POST
def session_action(request: HttpRequest, session_id: UUID, action: str) -> HttpResponse:
    session = _get_session(request, session_id)
    _require_operate(request)
    who, meta = request.user, _meta(request)
    post = request.POST
    try:
        if action == "resume":
            services.session_resume(session_id=session.id, actor=who, request_meta=meta)
            text = "Resumed: queued for a worker from its head checkpoint."
        elif action == "cancel":
            result = services.session_cancel(session_id=session.id, actor=who, request_meta=meta)
            text = (
                "Cancel requested: the worker stops at its next step."
                if result.status == Status.RUNNING
                else "Cancelled."
            )
        elif action == "rollback":
            seq = _int(post.get("checkpoint_seq"), "checkpoint")
            result = services.checkpoint_rollback(
                session_id=session.id, checkpoint_seq=seq, actor=who, request_meta=meta
            )
            text = (
                f"Rolled back to checkpoint {seq}; later steps are superseded. "
                "Paused until resumed."
            )
        elif action == "fork":
            seq = _int(post.get("checkpoint_seq"), "checkpoint")
            fork = services.session_fork(
                session_id=session.id, checkpoint_seq=seq, actor=who, request_meta=meta
            )
            messages.success(request, f"Forked from checkpoint {seq} of {session.id}.")
            url = reverse("sessions:detail", args=[fork.id])
            return HttpResponseClientRedirect(url) if request.htmx else redirect(url)
        elif action == "approve":
            services.session_approve(
                session_id=session.id, actor=who, reason=post.get("reason", ""), request_meta=meta
            )
            text = "Approved: the tool call runs now."
        elif action == "reject":
            services.session_reject(
                session_id=session.id, actor=who, reason=post.get("reason", ""), request_meta=meta
            )
            text = "Rejected: the model is told, and the session goes on."
        elif action == "answer":
            from .graph_services import session_answer_interrupt

            value = _json(post.get("value", ""), "the answer", text_allowed=True)
            session_answer_interrupt(
                session_id=session.id, value=value, actor=who, request_meta=meta
            )
            text = "Answered: the graph resumes with it."
        elif action == "uncertain":
            resolution = post.get("resolution", "")
            output = None
            if resolution == "record_result":
                output = _json(post.get("output", ""), "the recorded result")
            services.session_resolve_uncertain(
                session_id=session.id,
                resolution=resolution,
                output=output,
                note=post.get("note", ""),
                actor=who,
                request_meta=meta,
            )
            text = {
                "rerun": "The tool call runs again, with the same idempotency key.",
                "record_result": "Result recorded by hand; the session goes on.",
                "fail": "Session failed: the side effect stays uncertain, on record.",
            }[resolution]
        elif action == "message":
            services.session_send_message(
                session_id=session.id, content=post.get("content", ""), actor=who, request_meta=meta
            )
            text = "Message sent; the session is queued."
        elif action == "instruct":
            services.session_add_instruction(
                session_id=session.id, text=post.get("text", ""), actor=who, request_meta=meta
            )
            text = "Instruction added as an operator step; the session is queued."
        elif action == "correct":
            seq = _int(post.get("result_seq"), "tool result")
            output = _json(post.get("output", ""), "the corrected output")
            services.session_correct_result(
                session_id=session.id,
                result_seq=seq,
                output=output,
                note=post.get("note", ""),
                actor=who,
                request_meta=meta,
            )
            text = f"Result of step {seq} corrected (an operator step); the session is queued."
        elif action in ("hold", "release"):
            services.session_set_legal_hold(
                session_id=session.id,
                hold=action == "hold",
                note=post.get("note", ""),
                actor=who,
                request_meta=meta,
            )
            text = (
                "On legal hold: no retention policy deletes anything of it."
                if action == "hold"
                else "Legal hold released: retention policies apply to it again."
            )
        else:
            raise Http404("no such action")
    except services.ActionError as exc:
        return _action_response(
            request, session, ok=False, text=str(exc), status=ACTION_STATUS.get(exc.code, 400)
        )
    return _action_response(request, session, ok=True, text=text)


def _int(raw: str | None, what: str) -> int:
    try:
        return parse_int(raw if raw is not None else "", what)
    except InvalidInput:
        raise services.ActionError(f"choose a {what} (a step number)", code="invalid") from None


def _json(raw: str, what: str, *, text_allowed: bool = False) -> Any:
    """JSON from a form field (depth-checked first); with `text_allowed`, what does not
    parse as JSON is taken as plain text."""
    try:
        return load_json(raw, what)
    except InvalidInput as exc:
        if text_allowed and exc.problem.startswith("not valid JSON"):
            return raw
        raise services.ActionError(str(exc), code="invalid") from None


# --- Audit log and attention ------------------------------------------------------------


@login_required
@require_GET
def audit_log(request: HttpRequest) -> HttpResponse:
    _require_view(request)
    events = AuditEvent.objects.select_related("session").order_by("-id")
    actor = (request.GET.get("actor") or "").strip()
    action = (request.GET.get("action") or "").strip()
    session_q = (request.GET.get("session") or "").strip()
    error = None
    if actor:
        events = events.filter(actor_label__iexact=actor)
    if action:
        events = events.filter(action=action)
    if session_q:
        try:
            events = events.filter(session_id=UUID(session_q))
        except ValueError:
            error = f"not a session id: {session_q!r}"
    before = request.GET.get("before", "")
    if before:
        try:
            events = events.filter(id__lt=parse_int(before, "before", maximum=2**63 - 1))
        except InvalidInput as exc:
            error = str(exc)
    page = list(events[: PAGE_SIZE + 1])
    more = len(page) > PAGE_SIZE
    page = page[:PAGE_SIZE]
    query = {k: v for k, v in {"actor": actor, "action": action, "session": session_q}.items() if v}
    return render(
        request,
        "sessions/audit.html",
        {
            "events": page,
            "next_query": {**query, "before": page[-1].id} if more and page else None,
            "query": query,
            "error": error,
            "actions": [
                "start",
                "resume",
                "cancel",
                "rollback",
                "fork",
                "forked",
                "approve",
                "reject",
                "message",
                "instruction",
                "correct_result",
            ],
        },
    )


# --- Export and import ------------------------------------------------------------------


@login_required
@require_GET
def session_export(request: HttpRequest, session_id: UUID) -> HttpResponse:
    """The session as a file (viewers may export: it is what they can read anyway)."""
    from .transfer import export_bytes

    session = _get_session(request, session_id)
    data = export_bytes(session, actor=request.user, request_meta=_meta(request))
    response = HttpResponse(data, content_type="application/gzip")
    response["Content-Disposition"] = f'attachment; filename="session-{session.id}.jsonl.gz"'
    return response


MAX_IMPORT_BYTES = 64 * 1024 * 1024  # through the browser; bigger files: manage.py import_session


@login_required
def session_import(request: HttpRequest) -> HttpResponse:
    """Upload an export (operators): checked whole, then written at once, or not at all."""
    from .transfer import TransferError, import_session

    _require_view(request)
    _require_operate(request)
    error = ""
    if request.method == "POST":
        upload = request.FILES.get("file")
        if upload is None:
            error = "choose an exported session file (.jsonl.gz)"
        elif upload.size > MAX_IMPORT_BYTES:
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
                    f"{result.audit} audit records"
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
def agents(request: HttpRequest) -> HttpResponse:
    """The agents this deployment runs, their tools, and their live sessions per version."""
    _require_view(request)
    return render(
        request,
        "sessions/agents.html",
        {
            "overview": selectors.agents_overview(),
            "model_override": settings.RESPAWN_MODEL,
        },
    )


@login_required
@require_GET
def attention(request: HttpRequest) -> HttpResponse:
    _require_view(request)
    counts = selectors.status_counts()
    activity = selectors.activity_last_24h()
    peak = max([max(h["started"], h["finished"]) for h in activity] + [1])
    bar_w = 22
    chart = [
        {
            "x": 30 + i * (bar_w + 6),
            "started_h": 100 * h["started"] / peak,
            "finished_h": 100 * h["finished"] / peak,
            "started_y": 110 - 100 * h["started"] / peak,
            "finished_y": 110 - 100 * h["finished"] / peak,
            **h,
        }
        for i, h in enumerate(activity)
    ]
    approval_sla = timedelta(seconds=settings.RESPAWN_APPROVAL_SLA)
    return render(
        request,
        "sessions/attention.html",
        {
            "stuck": selectors.stuck_sessions(),
            "approvals": selectors.overdue_approvals(),
            "approval_sla": approval_sla,
            "failures": selectors.repeated_failures(),
            "uncertain": selectors.uncertain_sessions(),
            "incompatible": list(selectors.incompatible_sessions()[:100]),
            "old_schema": selectors.old_schema_sessions(),
            "counts": [(value, label, counts[value]) for value, label in Status.choices],
            "chart": chart,
            "peak": peak,
            "bar_w": bar_w,
            "can_operate": can_operate(request.user),
            "final": [s.value for s in FINAL],
        },
    )
