"""django-rq's queue dashboard, mounted once (under /admin/rq/) behind Respawn's roles.

- Every page needs what the admin site needs: an active staff account with a Respawn
  role (`RespawnAdminSite.has_permission`); anyone else is sent to the admin's log-in.
- Every page that changes a queue (empty it, delete, requeue, enqueue or stop jobs), and
  every non-GET request, needs the admin role (`can_administer`): 403 otherwise.
- What django-rq answers with a 500 for a missing queue, job or worker answers 404 here; its
  bulk actions redirect only within this site (their target comes from the request).
- Not mounted: the rq-scheduler pages (that package is not installed: every one of them
  fails), the Prometheus endpoint, and the statistics JSON's token variants (a token scheme
  of their own, RQ_API_TOKEN, beside Respawn's roles; with no token configured a token URL
  answers 500). The statistics JSON is served to the same people as the pages. The admin
  index links here instead of mounting the same views again.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect
from django.urls import URLPattern, re_path, reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django_rq import cron_views, stats_views, views
from django_rq.urls import get_admin_urlpatterns
from rq.exceptions import NoSuchJobError

from ..permissions import can_administer

# Views that change a queue, whatever the method (their GET is a confirmation form).
ACTING_VIEWS = {
    views.clear_queue,
    views.requeue_all,
    views.delete_failed_jobs,
    views.delete_job,
    views.requeue_job_view,
    views.enqueue_job,
    views.stop_job,
    views.confirm_action,
    views.actions,
}
UNMOUNTED_VIEWS = {views.scheduler_jobs}
MOUNTED_VIEWS = {
    stats_views.stats,
    stats_views.prometheus_metrics,
    views.jobs,
    views.queue_details,
    views.finished_jobs,
    views.failed_jobs,
    views.scheduled_jobs,
    views.started_jobs,
    views.deferred_jobs,
    views.job_detail,
    views.result_detail,
    views.workers,
    views.worker_details,
    cron_views.cron_scheduler_detail,
    cron_views.cron_job_detail,
    *ACTING_VIEWS,
}
APP_NAME = "django_rq"


def _guard(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    acting = view in ACTING_VIEWS

    @wraps(view)
    def guarded(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if (acting or request.method not in ("GET", "HEAD")) and not can_administer(request.user):
            raise PermissionDenied("only admins act on the job queues")
        try:
            response = view(request, *args, **kwargs)
        except (IndexError, NoSuchJobError, ValueError):
            # get_queue_by_index(n) past the configured queues, Job.fetch of a gone job,
            # Worker.find_by_key of a name that is no worker key: all from the URL.
            raise Http404("no such queue, job or worker") from None
        if isinstance(response, HttpResponseRedirect) and not url_has_allowed_host_and_scheme(
            response.url, allowed_hosts={request.get_host()}, require_https=request.is_secure()
        ):
            # confirm_action/actions redirect to the Referer or a posted next_url.
            return redirect(reverse(f"{APP_NAME}:home"))
        return response

    # The admin site's own gate: log-in, staff, a Respawn role (and never cached).
    return admin.site.admin_view(guarded)


def urlpatterns() -> list[URLPattern]:
    mounted = [
        re_path(r"^stats.json/?$", _guard(stats_views.stats_json), name="home_json"),
        # The queues' Prometheus metrics (rq_jobs, rq_workers), linked from the stats page;
        # Respawn's own are at /metrics.
        re_path(r"^metrics/?$", _guard(stats_views.prometheus_metrics), name="metrics"),
    ]
    guarded: dict[Callable[..., HttpResponse], Callable[..., HttpResponse]] = {}

    def guard(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        served = _guard(view)
        guarded[served] = view  # what each pattern serves, to classify it below
        return served

    for pattern in get_admin_urlpatterns(view_wrapper=guard):
        view = guarded[pattern.callback]
        if view in UNMOUNTED_VIEWS:
            continue
        if view not in MOUNTED_VIEWS:
            # A view a newer django-rq added: classify it above before it is served.
            raise RuntimeError(f"unclassified django-rq view {view.__name__}")
        mounted.append(pattern)
    return mounted
