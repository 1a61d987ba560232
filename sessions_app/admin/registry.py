"""The Django admin for fixing records by hand, without corrupting a session and without
a COUNT(*) over millions of rows.

- History (seq, fencing token, lease, times, superseded marker, schema version) is
  read-only; the only editable fields are a session's title, a step's payload and a
  checkpoint's state, and the JSON ones are checked against the state schema.
- Every save goes through `admin_services` (locks, refuses to race a worker, audits the
  full before and after values); session actions go through `services`, like the dashboard.
- Nothing of a session's history is added or deleted here; audit events are read-only.
- Changelists count with `LargeTablePaginator`, filter through indexes (migration
  0011_admin_indexes) and draw the date hierarchy from MIN/MAX only
  (templatetags/admin_scale.py).
"""

from __future__ import annotations

import json
import math
from typing import Any, ClassVar

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.widgets import AutocompleteSelect
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Exists, OuterRef, Q, QuerySet, TextField
from django.db.models.functions import Cast, Left
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse, reverse_lazy
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html
from django_rq.models import Dashboard as RqDashboard

from agent_runtime.state import SCHEMA_VERSION

from ..models import (
    AgentSession,
    AlertDelivery,
    AlertRule,
    ApiToken,
    AuditEvent,
    Checkpoint,
    Membership,
    Step,
    Team,
    TeamAgent,
)
from ..permissions import can_administer, can_operate, can_view
from ..runtime import agent_registry
from ..selectors import core as selectors
from ..services import core as services
from ..services import records as admin_services
from ..validation import InvalidInput, parse_int
from ..web.http import ADMIN, BULK_LIMIT, parse_uuid, request_meta
from . import queues as queues_admin
from .forms import ApiTokenAddForm, CheckpointAdminForm, SessionAdminForm, StepAdminForm
from .site import CheckedChangeList, RoleRules

admin.site.site_header = "Respawn admin"
admin.site.site_title = "Respawn admin"
admin.site.index_title = "Records"
# "View site" opens the dashboard (lazy: the URLconf is not loaded yet).
admin.site.site_url = reverse_lazy("sessions:list")  # type: ignore[assignment]

PREVIEW_CHARS = 120
MESSAGES_PER_ACTION = 50  # per-session lines in an action's report; a summary for the rest


# --- Counting and listing at scale -------------------------------------------------------


class LargeTablePaginator(Paginator):
    """A paginator that never counts a whole table.

    Unfiltered: the planner's row estimate (pg_class.reltuples), unless it is small or
    unknown. Filtered (or small): COUNT(*) over at most `max_rows` + 1 rows, so
    the count reads a bounded number of rows and "more than 10,000" is as precise as it
    gets. Pages stop at `max_rows` too: OFFSET costs what it skips, so deeper rows are
    reached by filtering, searching, the date hierarchy or the reverse sort, not page 5,000.
    """

    max_rows = 10_000

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.count_is_exact = True
        self.count_is_estimate = False

    @cached_property
    def count(self) -> int:
        rows = self.object_list
        if not isinstance(rows, QuerySet):
            return len(rows)
        if not rows.query.where:
            estimate = self._estimate(rows)
            if estimate > self.max_rows:
                self.count_is_exact, self.count_is_estimate = False, True
                return estimate
        # SELECT COUNT(*) FROM (SELECT id ... LIMIT 10001): reads at most that many rows.
        capped = rows.order_by().values("pk")[: self.max_rows + 1].count()
        if capped > self.max_rows:
            self.count_is_exact = False
        return capped

    @staticmethod
    def _estimate(rows: QuerySet) -> int:
        connection = connections[rows.db]
        if connection.vendor != "postgresql":
            return -1
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass",
                [rows.model._meta.db_table],
            )
            row = cursor.fetchone()
        return int(row[0]) if row else -1  # -1: never analysed

    @cached_property
    def num_pages(self) -> int:
        if self.count == 0 and not self.allow_empty_first_page:
            return 0
        reachable = min(self.count, self.max_rows)
        return max(1, math.ceil(reachable / self.per_page))

    @property
    def count_label(self) -> str:
        count = self.count  # sets the two flags
        if self.count_is_estimate:
            return f"about {count:,}"
        if not self.count_is_exact:
            return f"more than {self.max_rows:,}"
        return f"{count:,}"


class PreviewChangeList(CheckedChangeList):
    """Lists read the first characters of a large JSON column, not the whole blob."""

    def get_queryset(self, request, exclude_parameters=None):
        rows = super().get_queryset(request, exclude_parameters)
        column = getattr(self.model_admin, "preview_column", None)
        if column:
            rows = rows.defer(column).annotate(
                preview_text=Left(Cast(column, TextField()), PREVIEW_CHARS + 1)
            )
        return rows


class LargeTableAdmin(admin.ModelAdmin):
    paginator = LargeTablePaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    # Rendering dominates a page once the queries are cheap (~0.8 ms a row at ten
    # columns): the dashboard's page size, not the admin's default of 100.
    list_per_page = 50
    preview_column: str | None = None

    def action_checkbox(self, obj):
        # Django's own renders a CheckboxInput template per row (a third of a page's
        # time); this is the same markup.
        return format_html(
            '<input type="checkbox" name="{}" value="{}" class="action-select" '
            'aria-label="Select this object for an action - {}">',
            helpers.ACTION_CHECKBOX_NAME,
            obj.pk,
            str(obj),
        )

    def get_changelist(self, request, **kwargs):
        return PreviewChangeList

    def object_links(self, obj: Any) -> list[tuple[str, str]]:
        return []

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        context["object_links"] = self.object_links(obj) if obj is not None else []
        return super().render_change_form(request, context, add, change, form_url, obj)

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        # The save runs in admin_services under the session's lock; if the session started
        # running after the form was validated, the service refuses and nothing is saved
        # (the admin's transaction rolls back as the error leaves it).
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except services.ActionError as exc:
            self.message_user(request, f"Nothing was saved: {exc}", messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())

    @admin.display(description="preview")
    def preview(self, obj: Any) -> str:
        text = getattr(obj, "preview_text", None)
        if text is None:
            text = json.dumps(getattr(obj, str(self.preview_column)), ensure_ascii=False)
        return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…"


def _meta(request: HttpRequest) -> dict[str, Any]:
    return request_meta(request, ADMIN)


def _pretty_json(value: Any):
    return format_html("<pre>{}</pre>", json.dumps(value, ensure_ascii=False, indent=2))


def _session_admin_url(session_id: Any) -> str:
    return reverse("admin:sessions_app_agentsession_change", args=[session_id])


def _changelist_url(model_name: str, **params: Any) -> str:
    url = reverse(f"admin:sessions_app_{model_name}_changelist")
    query = "&".join(f"{key}={value}" for key, value in params.items())
    return f"{url}?{query}" if query else url


def _search_by_session_id(queryset: QuerySet, search_term: str) -> tuple[QuerySet, bool]:
    """The search box of step, checkpoint and audit lists: an exact session id."""
    term = search_term.strip()
    if not term:
        return queryset, False
    session_id = parse_uuid(term)
    if session_id is None:
        return queryset.none(), False
    return queryset.filter(session_id=session_id), False


# --- Filters (each served by an index; none lists values by scanning the table) ----------


class StuckFilter(admin.SimpleListFilter):
    title = "stuck"
    parameter_name = "stuck"

    def lookups(self, request, model_admin):
        return [("yes", "Stuck (runnable, no live lease)")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            # Served by the partial index session_runnable_updated.
            return queryset.filter(AgentSession.stuck_q())
        return queryset


class AgentFilter(admin.SimpleListFilter):
    """The registered agents, not SELECT DISTINCT agent over every session."""

    title = "agent"
    parameter_name = "agent"

    def lookups(self, request, model_admin):
        names = list(agent_registry().names())
        value = self.value()
        if value and value not in names:
            names.append(value)  # an agent no longer registered, picked by URL
        return [(name, name) for name in names]

    def queryset(self, request, queryset):
        return queryset.filter(agent=self.value()) if self.value() else queryset


VERSION_CHOICES = [(str(v), f"v{v}") for v in range(1, SCHEMA_VERSION + 1)] + [
    ("newer", f"newer than v{SCHEMA_VERSION} (this code cannot load it)")
]


def _version_q(value: str, field: str = "schema_version") -> Q:
    if value == "newer":
        return Q(**{f"{field}__gt": SCHEMA_VERSION})
    try:
        return Q(**{field: parse_int(value, "schema version", maximum=32767)})
    except InvalidInput:
        raise IncorrectLookupParameters(f"not a schema version: {value!r}") from None


class SchemaVersionFilter(admin.SimpleListFilter):
    title = "schema version"
    parameter_name = "schema_version"

    def lookups(self, request, model_admin):
        return VERSION_CHOICES

    def queryset(self, request, queryset):
        value = self.value()
        return queryset.filter(_version_q(value)) if value else queryset


class HeadSchemaVersionFilter(SchemaVersionFilter):
    """Sessions whose head checkpoint is stored at a schema version (checkpoint_version
    finds the rare versions; the common one is found walking the list's own index)."""

    title = "schema version of the head checkpoint"
    parameter_name = "head_version"

    def queryset(self, request, queryset):
        value = self.value()
        if not value:
            return queryset
        at_head = Checkpoint.objects.filter(session=OuterRef("pk"), seq=OuterRef("head")).filter(
            _version_q(value)
        )
        return queryset.filter(Exists(at_head))


class SessionFilter(admin.SimpleListFilter):
    """Rows of one session; shown only once a session is picked (by the links on the
    session's admin page), since listing sessions here would list a million of them."""

    title = "session"
    parameter_name = "session"

    def lookups(self, request, model_admin):
        value = self.value()
        if not value:
            return []
        session_id = parse_uuid(value)
        if session_id is None:
            raise IncorrectLookupParameters(f"not a session id: {value!r}")
        session = selectors.session_by_id(session_id)
        return [(value, str(session) if session else value)]

    def queryset(self, request, queryset):
        if not self.value():
            return queryset
        session_id = parse_uuid(self.value())
        if session_id is None:
            raise IncorrectLookupParameters(f"not a session id: {self.value()!r}")
        return queryset.filter(session_id=session_id)


class RecentActionFilter(admin.SimpleListFilter):
    """The actions seen in the latest events (a bounded read, not DISTINCT over the log)."""

    title = "action"
    parameter_name = "action"
    recent = 10_000

    def lookups(self, request, model_admin):
        actions = selectors.recent_audit_actions(self.recent)
        value = self.value()
        if value:
            actions.add(value)
        return [(action, action) for action in sorted(actions)]

    def queryset(self, request, queryset):
        # Served by audit_action_created.
        return queryset.filter(action=self.value()) if self.value() else queryset


class TokenStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [("active", "Active"), ("revoked", "Revoked or expired")]

    def queryset(self, request, queryset):
        # Active: not revoked and not expired (a team token has an expiry).
        live = Q(revoked_at__isnull=True) & (
            Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())
        )
        if self.value() == "active":
            return queryset.filter(live)
        if self.value() == "revoked":
            return queryset.exclude(live)
        return queryset


# --- Sessions ----------------------------------------------------------------------------


SESSION_HISTORY_FIELDS = (
    "id",
    "owner",
    "owned_since",
    "agent",
    "agent_version",
    "status",
    "stuck",
    "head",
    "last_seq",
    "step_count",
    "tokens_in",
    "tokens_out",
    "cost",
    "final_answer",
    "last_error",
    "progress_note",
    "lease_owner",
    "lease_expires_at",
    "fencing_token",
    "cancel_requested",
    "job_id",
    "dispatched_at",
    "crash_count",
    "crash_seq",
    "incompatible_reason",
    "incompatible_at",
    "incompatible_code_schema",
    "incompatible_agent_version",
    "created_by",
    "parent",
    "fork_seq",
    "created_at",
    "updated_at",
)


@admin.register(AgentSession)
class AgentSessionAdmin(LargeTableAdmin):
    form = SessionAdminForm
    list_display = (
        "display_title",
        "short_id",
        "agent",
        "agent_version",
        "status",
        "stuck",
        "step_count",
        "head",
        "updated_at",
        "created_at",
        "dashboard",
    )
    list_display_links = ("display_title",)
    list_filter = ("status", AgentFilter, StuckFilter, HeadSchemaVersionFilter)
    search_fields = ("title",)  # and an exact id: see get_search_results
    search_help_text = "A session id (exact), or words of the title."
    date_hierarchy = "created_at"
    ordering = ("-updated_at", "-id")
    # Only the orders an index serves (session_updated, session_created).
    sortable_by = ("updated_at", "created_at")
    readonly_fields = SESSION_HISTORY_FIELDS
    fieldsets = (
        (None, {"fields": ("title", "id", "agent", "agent_version", "status", "stuck")}),
        (
            "Progress",
            {
                "fields": (
                    "head",
                    "last_seq",
                    "step_count",
                    "tokens_in",
                    "tokens_out",
                    "cost",
                    "final_answer",
                    "last_error",
                    "progress_note",
                )
            },
        ),
        (
            "Lease and dispatch",
            {
                "fields": (
                    "lease_owner",
                    "lease_expires_at",
                    "fencing_token",
                    "cancel_requested",
                    "job_id",
                    "dispatched_at",
                    "crash_count",
                    "crash_seq",
                )
            },
        ),
        (
            "Compatibility",
            {
                "fields": (
                    "incompatible_reason",
                    "incompatible_at",
                    "incompatible_code_schema",
                    "incompatible_agent_version",
                )
            },
        ),
        ("Origin", {"fields": ("created_by", "parent", "fork_seq", "created_at", "updated_at")}),
        # Taken and handed on through the dashboard or the API (audited), never edited here.
        ("Work queue", {"fields": ("owner", "owned_since")}),
    )
    actions = (
        "resume_sessions",
        "cancel_sessions",
        "rollback_sessions",
        "check_compat_sessions",
        "repair_times_sessions",
    )

    def has_add_permission(self, request):
        return False  # sessions start through the dashboard or the API

    def has_delete_permission(self, request, obj=None):
        return False  # cancel instead: steps and audit events point at it

    def has_operate_permission(self, request) -> bool:
        return can_operate(request.user)

    def get_queryset(self, request):
        # The "stuck" column asks whether any worker is busy: once for the page.
        return selectors.with_busy_workers(super().get_queryset(request))

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        session_id = parse_uuid(term)
        if session_id is not None:
            return queryset.filter(id=session_id), False
        # UPPER(title) LIKE '%term%': served by the trigram index session_title_trgm.
        return queryset.filter(title__icontains=term), False

    @admin.display(description="title")
    def display_title(self, obj: AgentSession) -> str:
        return obj.title or f"({obj.agent}, untitled)"

    @admin.display(description="id")
    def short_id(self, obj: AgentSession):
        return format_html('<code title="{}">{}</code>', obj.id, str(obj.id)[:8])

    @admin.display(description="stuck")
    def stuck(self, obj: AgentSession) -> str:
        # Words, not the admin's red/green icons: "not stuck" is not an alarm.
        return "stuck" if obj.is_stuck() else ""

    @admin.display(description="dashboard")
    def dashboard(self, obj: AgentSession):
        return format_html('<a href="{}">open</a>', reverse("sessions:detail", args=[obj.id]))

    def object_links(self, obj: AgentSession) -> list[tuple[str, str]]:
        return [
            ("Open in dashboard", reverse("sessions:detail", args=[obj.id])),
            (f"Steps ({obj.step_count:,})", _changelist_url("step", session=obj.id)),
            ("Checkpoints", _changelist_url("checkpoint", session=obj.id)),
            ("Audit events", _changelist_url("auditevent", session=obj.id)),
        ]

    def save_model(self, request, obj, form, change):
        if form.has_changed():
            session = admin_services.session_edit_title(
                session_id=obj.pk,
                title=form.cleaned_data["title"],
                actor=request.user,
                request_meta=_meta(request),
            )
            # What the admin writes next (its history, its message) names the title as
            # stored: redacted.
            obj.title = session.title

    # Actions: the operator functions the dashboard and the API call, one session at a
    # time, each writing its own audit event.

    def _each_session(self, request, queryset, run) -> None:
        rows = list(queryset.values_list("id", "title")[: BULK_LIMIT + 1])
        if len(rows) > BULK_LIMIT:
            self.message_user(
                request,
                f"At most {BULK_LIMIT:,} sessions at once; narrow the selection.",
                messages.ERROR,
            )
            return
        done = refused = 0
        for index, (session_id, title) in enumerate(rows):
            label = title or str(session_id)
            try:
                outcome, level = run(session_id, index), messages.SUCCESS
                done += 1
            except services.ActionError as exc:
                outcome, level = f"refused: {exc}", messages.WARNING
                refused += 1
            if index < MESSAGES_PER_ACTION:
                self.message_user(request, f"{label} ({session_id}): {outcome}", level)
        if len(rows) > MESSAGES_PER_ACTION:
            self.message_user(
                request, f"{done:,} done, {refused:,} refused in all ({len(rows):,} selected)."
            )

    @admin.action(description="Resume the selected sessions", permissions=["operate"])
    def resume_sessions(self, request, queryset):
        def run(session_id, index):
            # The dashboard's bulk resume: the first ones enqueued now, the rest in waves.
            return services.session_resume_in_bulk(
                session_id=session_id,
                position=index,
                actor=request.user,
                request_meta=_meta(request),
            )

        self._each_session(request, queryset, run)

    @admin.action(description="Cancel the selected sessions", permissions=["operate"])
    def cancel_sessions(self, request, queryset):
        def run(session_id, index):
            services.session_cancel(
                session_id=session_id, actor=request.user, request_meta=_meta(request)
            )
            return "cancelled"

        self._each_session(request, queryset, run)

    @admin.action(
        description="Roll back the selected sessions to their latest checkpoint",
        permissions=["operate"],
    )
    def rollback_sessions(self, request, queryset):
        def run(session_id, index):
            _, seq = admin_services.session_rollback_to_latest(
                session_id=session_id, actor=request.user, request_meta=_meta(request)
            )
            return f"rolled back to checkpoint {seq}, paused"

        self._each_session(request, queryset, run)

    @admin.action(
        description="Re-run the compatibility check on the selected sessions",
        permissions=["operate"],
    )
    def check_compat_sessions(self, request, queryset):
        def run(session_id, index):
            problem = services.session_check_compat(
                session_id=session_id, actor=request.user, request_meta=_meta(request)
            )
            return f"cannot be loaded: {problem}" if problem else "loads with this code"

        self._each_session(request, queryset, run)

    @admin.action(
        description="Repair times no page can read (moved to now) on the selected sessions",
        permissions=["operate"],
    )
    def repair_times_sessions(self, request, queryset):
        def run(session_id, index):
            moved = services.session_repair_times(
                session_id=session_id, actor=request.user, request_meta=_meta(request)
            )
            return f"moved to now: {', '.join(moved)}" if moved else "nothing to repair"

        self._each_session(request, queryset, run)


# --- Steps and checkpoints -----------------------------------------------------------------


def _with_editable(readonly: tuple[str, ...], editable: str, *, after: str) -> tuple[str, ...]:
    """A history row's form: its read-only fields, and its one editable field after `after`."""
    at = readonly.index(after) + 1
    return (*readonly[:at], editable, *readonly[at:])


class SessionRowsAdmin(LargeTableAdmin):
    """Rows that belong to a session: in trace order within one session, newest first
    across sessions (each order served by an index)."""

    list_select_related = ("session",)
    list_filter: ClassVar[tuple[Any, ...]] = (SessionFilter,)
    search_fields = ("session__id",)  # an exact session id: see get_search_results
    search_help_text = "A session id (exact)."
    sortable_by = ()

    def has_add_permission(self, request):
        return False  # history is appended by the engine

    def has_delete_permission(self, request, obj=None):
        return False  # history is superseded by a rollback, never deleted

    # The trace order, unique per session, so no tiebreaker is appended to it.
    session_ordering: tuple[str, ...] = ("session", "seq")

    def get_ordering(self, request):
        one_session = request.GET.get(SessionFilter.parameter_name) or parse_uuid(
            request.GET.get("q", "")
        )
        if one_session:
            return self.session_ordering  # the (session, seq, ...) unique index
        return ("-id",)

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("session")

    def get_search_results(self, request, queryset, search_term):
        return _search_by_session_id(queryset, search_term)

    @admin.display(description="session")
    def session_link(self, obj: Any):
        return format_html(
            '<a href="{}" title="{}"><code>{}</code></a>',
            _session_admin_url(obj.session_id),
            str(obj.session),
            str(obj.session_id)[:8],
        )

    @admin.display(description="session")
    def session_detail_link(self, obj: Any):
        return format_html(
            '<a href="{}">{}</a> <code>{}</code>',
            _session_admin_url(obj.session_id),
            str(obj.session),
            obj.session_id,
        )

    def _dashboard_url(self, obj: Any) -> str:
        """The row's place in the dashboard's trace (superseded steps shown)."""
        base = reverse("sessions:detail", args=[obj.session_id])
        return f"{base}?from={obj.seq}&superseded=1#step-{obj.seq}"

    def object_links(self, obj: Any) -> list[tuple[str, str]]:
        rows = f"{str(self.opts.verbose_name_plural).capitalize()} of this session"
        return [
            ("Open in dashboard", self._dashboard_url(obj)),
            ("Session", _session_admin_url(obj.session_id)),
            (rows, _changelist_url(str(self.opts.model_name), session=obj.session_id)),
        ]

    def save_edit(self, obj: Any, value: Any, **who: Any) -> None:
        """Save the row's one editable value through admin_services."""
        raise NotImplementedError

    def save_model(self, request, obj, form, change):
        if form.has_changed():
            value = form.cleaned_data[form.blob]
            self.save_edit(obj, value, actor=request.user, request_meta=_meta(request))

    @admin.display(description="session now")
    def session_state(self, obj: Any):
        session = obj.session
        running = " — running: edits are refused until it stops" if session.lease_is_live() else ""
        return f"{session.get_status_display()}{running}"


@admin.register(Step)
class StepAdmin(SessionRowsAdmin):
    form = StepAdminForm
    preview_column = "payload"
    list_display = (
        "seq",
        "kind",
        "session_link",
        "schema_version",
        "superseded",
        "preview",
        "created_at",
        "dashboard",
    )
    list_display_links = ("seq",)
    list_filter = (SessionFilter, "kind", SchemaVersionFilter)
    readonly_fields = (
        "session_detail_link",
        "session_state",
        "seq",
        "kind",
        "schema_version",
        "started_at",
        "finished_at",
        "tokens_in",
        "tokens_out",
        "idempotency_key",
        "superseded_at",
        "created_at",
    )
    fields = _with_editable(readonly_fields, "payload", after="schema_version")

    @admin.display(description="superseded")
    def superseded(self, obj: Step) -> str:
        return "superseded" if obj.superseded_at is not None else ""

    @admin.display(description="dashboard")
    def dashboard(self, obj: Step):
        return format_html('<a href="{}">open</a>', self._dashboard_url(obj))

    def save_edit(self, obj: Step, value: Any, **who: Any) -> None:
        admin_services.step_edit_payload(step_id=obj.pk, payload=value, **who)


@admin.register(Checkpoint)
class CheckpointAdmin(SessionRowsAdmin):
    form = CheckpointAdminForm
    preview_column = "state"
    session_ordering = ("session", "seq", "reason")
    list_display = (
        "seq",
        "reason",
        "session_link",
        "schema_version",
        "is_head",
        "preview",
        "created_at",
    )
    list_display_links = ("seq",)
    list_filter = (SessionFilter, "reason", SchemaVersionFilter)
    readonly_fields = (
        "session_detail_link",
        "session_state",
        "seq",
        "reason",
        "schema_version",
        "is_head",
        "created_at",
    )
    fields = _with_editable(readonly_fields, "state", after="is_head")

    @admin.display(description="at the head")
    def is_head(self, obj: Checkpoint) -> str:
        return "head" if obj.seq == obj.session.head else ""

    def save_edit(self, obj: Checkpoint, value: Any, **who: Any) -> None:
        admin_services.checkpoint_edit_state(checkpoint_id=obj.pk, state=value, **who)


# --- The audit log (read-only for everyone; the database refuses changes anyway) ----------


@admin.register(AuditEvent)
class AuditEventAdmin(LargeTableAdmin):
    list_display = ("created_at", "actor_label", "action", "session_link", "summary")
    list_filter = (RecentActionFilter, SessionFilter)
    search_fields = ("session__id",)  # an exact session id: see get_search_results
    search_help_text = "A session id (exact)."
    date_hierarchy = "created_at"
    ordering = ("-created_at", "-id")
    sortable_by = ()
    fields = (
        "created_at",
        "actor_label",
        "actor",
        "action",
        "session_link",
        "before_json",
        "after_json",
        "request_meta_json",
    )
    readonly_fields = fields

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_search_results(self, request, queryset, search_term):
        return _search_by_session_id(queryset, search_term)

    @admin.display(description="session")
    def session_link(self, obj: AuditEvent):
        if obj.session_id is None:
            return "–"
        return format_html(
            '<a href="{}"><code>{}</code></a>', _session_admin_url(obj.session_id), obj.session_id
        )

    @admin.display(description="change")
    def summary(self, obj: AuditEvent) -> str:
        # Objects as services write them; a record written by hand may hold any JSON.
        before = obj.before if isinstance(obj.before, dict) else {}
        after = obj.after if isinstance(obj.after, dict) else {}
        keys = sorted(key for key in set(before) | set(after) if before.get(key) != after.get(key))
        return ", ".join(keys)[:PREVIEW_CHARS]

    @admin.display(description="before")
    def before_json(self, obj: AuditEvent):
        return _pretty_json(obj.before)

    @admin.display(description="after")
    def after_json(self, obj: AuditEvent):
        return _pretty_json(obj.after)

    @admin.display(description="request")
    def request_meta_json(self, obj: AuditEvent):
        return _pretty_json(obj.request_meta)


# --- API tokens ----------------------------------------------------------------------------


class CheckedAutocompleteSelect(AutocompleteSelect):
    """Redisplays a submitted value that is no id as nothing chosen; Django's own looks it
    up as an id and fails the page (a 500) on `user=abc`."""

    def optgroups(self, name, value, attr=None):
        target = self.field.target_field
        ids = []
        for item in value:
            try:
                target.to_python(item)
            except ValidationError:
                continue
            ids.append(item)
        return super().optgroups(name, ids, attr)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Issue (the secret is shown once, on the page that answers the add), list, revoke.
    A token is never edited or deleted: revoked tokens stay, with their last use."""

    list_display = (
        "key_prefix",
        "name",
        "user",
        "team",
        "role",
        "active",
        "created_at",
        "expires_at",
        "last_used_at",
    )
    list_filter = (TokenStateFilter,)
    list_select_related = ("user", "team")
    search_fields = ("name", "key_prefix", "user__username")
    date_hierarchy = "created_at"
    autocomplete_fields = ("user",)
    fields = (
        "user",
        "name",
        "team",
        "role",
        "expires_at",
        "key_prefix",
        "created_at",
        "last_used_at",
        "revoked_at",
    )
    readonly_fields = (
        "team",
        "role",
        "expires_at",
        "key_prefix",
        "created_at",
        "last_used_at",
        "revoked_at",
    )
    actions = ("revoke_tokens",)
    show_facets = admin.ShowFacets.NEVER
    paginator = LargeTablePaginator  # few rows, but no list here counts a whole table
    show_full_result_count = False

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is None:
            kwargs["form"] = ApiTokenAddForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_changelist(self, request, **kwargs):
        return CheckedChangeList

    def get_autocomplete_fields(self, request):
        # Searching accounts is for admins; anyone else issues tokens for themselves.
        return self.autocomplete_fields if can_administer(request.user) else ()

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "user" and not can_administer(request.user):
            kwargs["queryset"] = get_user_model().objects.filter(pk=request.user.pk)
        elif db_field.name in self.get_autocomplete_fields(request):
            kwargs["widget"] = CheckedAutocompleteSelect(db_field, self.admin_site)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_fields(self, request, obj=None):
        return ("user", "name") if obj is None else self.fields

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_revoke_permission(self, request) -> bool:
        # Revoking is the one change a token takes: whoever may change tokens may revoke
        # (their own; other users' tokens only admins: admin_services.api_token_revoke).
        return can_operate(request.user) and request.user.has_perm("sessions_app.change_apitoken")

    @admin.display(description="active", boolean=True)
    def active(self, obj: ApiToken) -> bool:
        return obj.is_active

    def save_model(self, request, obj, form, change):
        token, raw = admin_services.api_token_issue(
            user=form.cleaned_data["user"],
            name=form.cleaned_data["name"],
            actor=request.user,
            request_meta=_meta(request),
        )
        obj.pk = token.pk
        obj.refresh_from_db()
        obj._issued_secret = raw  # for response_add only; never stored

    def response_add(self, request, obj, post_url_continue=None) -> HttpResponse:
        # The secret goes into this response and nowhere else: not a message (those sit
        # in the session or a cookie until shown), not a log, not the database.
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "token": obj,
            "secret": obj._issued_secret,
            "title": "API token issued",
            "change_url": reverse("admin:sessions_app_apitoken_change", args=[obj.pk]),
        }
        response = TemplateResponse(request, "admin/sessions_app/apitoken/issued.html", context)
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description="Revoke the selected tokens", permissions=["revoke"])
    def revoke_tokens(self, request, queryset):
        for token_id, prefix in queryset.values_list("id", "key_prefix")[:BULK_LIMIT]:
            try:
                admin_services.api_token_revoke(
                    token_id=token_id, actor=request.user, request_meta=_meta(request)
                )
                self.message_user(request, f"{prefix}…: revoked", messages.SUCCESS)
            except services.ActionError as exc:
                self.message_user(request, f"{prefix}…: {exc}", messages.WARNING)


# --- Teams ------------------------------------------------------------------------------


class TeamAgentInline(admin.TabularInline):
    model = TeamAgent
    extra = 1


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1


@admin.register(Team)
class TeamAdmin(RoleRules, admin.ModelAdmin):
    """Teams, the agents each owns and its members' roles: for admins (who may see every
    team). RESPAWN_TEAMS declares teams in settings too (manage.py sync_teams). A team's
    API tokens are issued and revoked on the dashboard's team page, by its team admins."""

    list_display = ("name", "slug")
    search_fields = ("name", "slug", "agents__agent")
    prepopulated_fields = {"slug": ("name",)}
    inlines = (TeamAgentInline, MembershipInline)

    def role_allows(self, request, *, write: bool) -> bool:
        return can_administer(request.user)


# --- The queue dashboard ------------------------------------------------------------------


@admin.register(RqDashboard)
class QueueDashboardAdmin(RoleRules, admin.ModelAdmin):
    """The admin index's link to django-rq's dashboard, which is mounted once, under
    /admin/rq/ (sessions_app/admin/queues.py); nothing else of django-rq is served here."""

    def has_module_permission(self, request) -> bool:
        return can_view(request.user)

    def has_view_permission(self, request, obj=None) -> bool:
        return can_view(request.user) and obj is None

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def get_urls(self):
        return [
            path(
                "",
                self.admin_site.admin_view(self.changelist_view),
                name="django_rq_dashboard_changelist",
            )
        ]

    def changelist_view(self, request, extra_context=None):
        return HttpResponseRedirect(reverse(f"{queues_admin.APP_NAME}:home"))


# --- Alerts -------------------------------------------------------------------------------
# Read-only here: rules are managed on the dashboard's Alerts page, through the audited
# services; the admin never shows a rule's secret, and masks its URL as the pages do.


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(AlertRule)
class AlertRuleAdmin(ReadOnlyAdmin):
    list_display = ("name", "agent", "reasons", "channel", "shown_target", "enabled", "created_at")
    fields = (
        "name",
        "agent",
        "reasons",
        "channel",
        "shown_target",
        "secret",
        "enabled",
        "send_resolved",
        "created_by",
        "created_at",
    )
    readonly_fields = fields
    show_facets = admin.ShowFacets.NEVER

    @admin.display(description="sends to")
    def shown_target(self, obj: AlertRule) -> str:
        return obj.shown_target

    @admin.display(description="secret")
    def secret(self, obj: AlertRule) -> str:
        return "•••••••• (shown once, when the rule was created)" if obj.secret_key_id else "–"


@admin.register(AlertDelivery)
class AlertDeliveryAdmin(ReadOnlyAdmin, LargeTableAdmin):
    list_display = ("created_at", "rule", "kind", "status", "response_code", "attempts", "uid")
    list_select_related = ("rule",)
    list_filter = ("status", "kind")
    ordering = ("-id",)
    sortable_by = ()
    fields = (
        "uid",
        "rule",
        "event",
        "kind",
        "status",
        "attempts",
        "next_attempt_at",
        "response_code",
        "last_error",
        "created_at",
        "delivered_at",
    )
    readonly_fields = fields
