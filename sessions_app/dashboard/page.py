"""The session page's context, built in one place.

The page and every part of it that is redrawn on its own (the panel after an action, the
polled header, the actions card when the session settles, the trace after an action or a
filter, the next page of steps) take their context from `SessionPage`, so a part redrawn
after an action says what the whole page would say. Each part asks only for the pieces it
shows: a 100,000-step trace must not make a header refresh slow."""

from __future__ import annotations

import json
from bisect import bisect_right
from typing import Any

from django.conf import settings
from django.utils import timezone

from agent_runtime.state import SCHEMA_VERSION

from ..models import FINAL, AgentSession, AuditAction
from ..permissions import can_operate_session
from ..selectors import core as selectors
from ..services import workqueue
from ..services.graphs import pending_interrupts
from ..web.http import HtmxRequest, positive_int
from . import trace
from .actions import ACTIONS
from .presenters import TraceContext, final_plan, progress_view, status_view

LIVE_POLL = "2s"
# Past this many steps a live session's timeline and tokens per turn (drawn over the whole
# session: ~0.5 s and ~0.08 s at 100,000 steps) follow the header's poll at most every 10 s.
LIVE_HEAVY_STEPS = 20_000


def live_throttle(session: AgentSession) -> str:
    """The hx-trigger modifier a whole-session part of a live page follows the poll with."""
    return " throttle:10s" if session.last_seq > LIVE_HEAVY_STEPS else ""


# The longest output (as indented JSON) the correction form is filled in with; a longer
# one is read in the trace, and the form starts empty rather than with a cut-off value.
PREFILL_MAX = 8_000
TRACE_REFRESH_MAX = 500  # steps a trace re-renders in place after an action
AUDIT_SHOWN = 20  # the session's latest audit records on its page

# The pieces each part shows, in order; piece `x` is SessionPage's method `_x`.
PARTS: dict[str, tuple[str, ...]] = {
    "header": ("base", "budgets", "failures"),
    "actions": ("base", "budgets", "tool_results"),
    "panel": ("base", "budgets", "failures", "tool_results"),
    "trace": ("trace",),
    "checkpoints": ("checkpoints",),
    "audit": ("audit",),
    "page": ("base", "budgets", "failures", "tool_results", "trace", "checkpoints", "audit"),
}


class SessionPage:
    """The context of one session's page, or of one of its parts, for one request."""

    def __init__(self, request: HtmxRequest, session: AgentSession) -> None:
        self.request = request
        self.session = session
        self.operate = can_operate_session(request.user, session)
        self._found_failures: trace.Failures | None = None

    def context(self, part: str = "page") -> dict[str, Any]:
        """The context of `part`, a key of PARTS."""
        context: dict[str, Any] = self._common()
        for piece in PARTS[part]:
            context.update(getattr(self, f"_{piece}")(context, part))
        return context

    def steps(
        self, page: trace.TracePage, filters: trace.TraceFilters, *, after: int
    ) -> dict[str, Any]:
        """The context of a page of steps loaded after the ones shown (on scroll, or the
        live tail): the trace piece's keys for that page."""
        return {**self._common(), **self._steps_of(page, filters, after=after)}

    def failures(self) -> trace.Failures:
        """The session's failed steps, counted once per request (header and trace share)."""
        if self._found_failures is None:
            self._found_failures = trace.failures(self.session)
        return self._found_failures

    # --- The pieces ---------------------------------------------------------------------

    def _common(self) -> dict[str, Any]:
        """What every part reads: the session, whether it may be changed, and polling;
        who owns it, and the warning an action of someone else's confirms."""
        session = self.session
        owner = workqueue.owner_name(session)
        mine = bool(owner) and session.owner_id == self.request.user.pk
        warning = ""
        if owner and not mine:
            since = (
                f" since {session.owned_since:%Y-%m-%d %H:%M} UTC" if session.owned_since else ""
            )
            warning = f"Owned by {owner}{since}: they may be acting on it too. "
        return {
            "owner_name": owner,
            "owned_by_me": mine,
            "owner_warning": warning,
            "session": self.session,
            "can_operate": self.operate,
            "actions": ACTIONS,
            "is_live": self.session.is_runnable,
            "live_poll": LIVE_POLL,
            "live_throttle": live_throttle(self.session),
        }

    def _base(self, context: dict[str, Any], part: str) -> dict[str, Any]:
        session = self.session
        checkpoint, state = selectors.head(session)
        plan = trace.current_plan(session, state) if state or session.head else []
        ended = session.status in FINAL
        return {
            "state": state,
            "status": status_view(session),
            # A finished session's plan is as it was left, not "in progress".
            "plan": final_plan(plan, session.status) if ended else plan,
            "plan_final": ended and bool(plan),
            "progress": progress_view(session, state),
            "now": timezone.now(),
            "duration": (session.updated_at - session.created_at) if session.updated_at else None,
            # The version the head is stored at (None before the first checkpoint).
            "schema_version": checkpoint.schema_version if checkpoint else None,
            "schema_current": SCHEMA_VERSION,
            "model": _model_name(session),
            "pending": state.get("pending_approval") if session.can_decide() else None,
            "uncertain": selectors.uncertain_call(session, state),
            # A LangGraph session stopped in interrupt(): what the graph asked.
            "interrupts": pending_interrupts(session),
        }

    def _budgets(self, context: dict[str, Any], part: str) -> dict[str, Any]:
        return {
            "budgets": selectors.session_budgets(self.session, context["state"]),
            "paused_by_budget": self.session.paused_by_budget,
        }

    def _failures(self, context: dict[str, Any], part: str) -> dict[str, Any]:
        return {"failures": self.failures()}

    def _tool_results(self, context: dict[str, Any], part: str) -> dict[str, Any]:
        # Only operators see the correction form that lists them, each with what it says
        # now: the form starts from the current output, not from nothing.
        if not self.operate:
            return {}
        return {
            "tool_results": [
                {"seq": seq, "name": name, "output": _prefill(output)}
                for seq, name, output in selectors.live_tool_results(self.session)
            ]
        }

    def _checkpoints(self, context: dict[str, Any], part: str) -> dict[str, Any]:
        checkpoints, older_checkpoints = selectors.latest_checkpoints(self.session)
        # The head: the last checkpoint written at the head seq (a rollback may leave an
        # older copy there), as session.head_checkpoint() picks it.
        head = max((c.pk for c in checkpoints if c.seq == self.session.head), default=None)
        return {
            "checkpoints": checkpoints,
            "older_checkpoints": older_checkpoints,
            "head_checkpoint_id": head,
            "now": timezone.now(),
        }

    def _audit(self, context: dict[str, Any], part: str) -> dict[str, Any]:
        audit = selectors.recent_audit(self.session, limit=AUDIT_SHOWN)
        # Only an imported session has imported history, and its import is on its audit
        # trail: no query for the others (unless the trail is longer than what is shown).
        imported: list[Any] = []
        imported_total = 0
        if len(audit) == AUDIT_SHOWN or any(e.action == AuditAction.IMPORT for e in audit):
            imported, imported_total = selectors.imported_audit(self.session)
        return {
            "audit": audit,
            "imported_audit": imported,
            "imported_audit_total": imported_total,
            "now": timezone.now(),
        }

    def _trace(self, context: dict[str, Any], part: str) -> dict[str, Any]:
        """The trace as the page (or its #trace part) shows it: from `from`, with filters.
        The trace redrawn on its own (after an action) goes as far as `upto`, so the steps
        it showed stay shown."""
        params = self.request.GET
        session = self.session
        filters = trace.TraceFilters.from_query(params)
        latest_from = max(session.last_seq - trace.TRACE_PAGE + 1, 1)
        # from=latest: the tail as it is when the link is followed, not when it was drawn.
        start = latest_from if params.get("from") == "latest" else positive_int(params.get("from"))
        upto = positive_int(params.get("upto")) if part == "trace" else None
        limit = trace.TRACE_PAGE
        if upto:
            limit = min(max(upto - (start or 1) + 1, trace.TRACE_PAGE), TRACE_REFRESH_MAX)
        after = start - 1 if start else 0
        page = trace.trace_page(session, after=after, filters=filters, limit=limit)
        failures = self.failures()
        return {
            "trace": page,
            **self._steps_of(page, filters, after=after),
            "trace_errors": filters.errors,
            "superseded_count": selectors.superseded_count(session),
            "from_seq": start,
            "earlier_from": max(start - trace.TRACE_PAGE, 1) if start and start > 1 else None,
            "failures": failures,
            "first_error": failures.first,
            "latest_from": latest_from,
            "trace_query": filters.query(**{"from": start}),
            "kinds": list(trace.KIND_FILTERS),
        }

    def _steps_of(
        self, page: trace.TracePage, filters: trace.TraceFilters, *, after: int
    ) -> dict[str, Any]:
        return {
            "margin": self._margin(page, after),
            "items": page.items,
            "more": page.more,
            "last_seq_shown": page.last_seq,
            "next_context": page.context,
            "tf": filters,
            "filter_query": filters.query(),
            "show_superseded": filters.superseded,
        }

    def _margin(self, page: trace.TracePage, after: int) -> dict[int, list[Any]]:
        """People's notes on this page of the trace, by the seq of the step shown beside
        each: the last step shown at or before the step the note was written at (the first
        one shown, for a note written before it). The last page takes every note after it."""
        if not page.views or not getattr(self.session, "has_notes", True):
            return {}
        notes = selectors.trace_notes(
            self.session, after=after, upto=page.last_seq if page.more else None
        )
        shown = [v.seq for v in page.views]
        margin: dict[int, list[Any]] = {}
        for note in notes:
            at = bisect_right(shown, note.seq)
            margin.setdefault(shown[at - 1] if at else shown[0], []).append(note)
        return margin


def steps_context(request: HtmxRequest) -> TraceContext | None:
    """The turns and runs the page before showed (and the worker of its run), if it said."""
    turns, runs = positive_int(request.GET.get("turns")), positive_int(request.GET.get("runs"))
    if turns is None or runs is None:
        return None
    return TraceContext(turns, runs, request.GET.get("worker", "")[:200])


def _prefill(output: Any) -> str | None:
    text = json.dumps(output, ensure_ascii=False, indent=2)
    return text if len(text) <= PREFILL_MAX else None


def _model_name(session: AgentSession) -> str:
    if settings.RESPAWN_MODEL:
        return settings.RESPAWN_MODEL
    try:
        from ..runtime import agent_registry

        return agent_registry().get(session.agent).model
    except KeyError:
        return "unknown agent"
