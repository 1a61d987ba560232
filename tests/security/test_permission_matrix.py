"""Every URL of the dashboard, the admin and the API, for every kind of user.

The URL list comes from the URL resolver (and, for the API, from its OpenAPI document), so a
new view that nobody classified here fails this test instead of shipping unchecked."""

from __future__ import annotations

import json
import re

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.urls import URLPattern, URLResolver, get_resolver

from sessions_app.dashboard.actions import ACTIONS, PREVIEWS
from sessions_app.models import (
    AlertRule,
    ApiToken,
    AuditEvent,
    Checkpoint,
    Membership,
    Step,
    Team,
)
from sessions_app.services.core import session_start

from ..conftest import run_inline

pytestmark = pytest.mark.django_db

ROLES = ["anonymous", "viewer", "operator", "staff", "staff_all_permissions", "superuser"]
NO_ROLE = ("staff", "staff_all_permissions")  # staff status (and model permissions), no role


def walk(patterns, prefix=""):
    for p in patterns:
        if isinstance(p, URLResolver):
            yield from walk(p.url_patterns, prefix + str(p.pattern))
        elif isinstance(p, URLPattern):
            yield prefix + str(p.pattern), p


def staff_with_every_permission(username: str, group: str | None = None) -> User:
    """Staff status and every model permission there is; a Respawn role only if given."""
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.all())
    if group:
        user.groups.add(Group.objects.get(name=group))
    return User.objects.get(pk=user.pk)


@pytest.fixture
def world(users):
    staff = User.objects.create_user("stan", password="pw", is_staff=True)
    superuser = User.objects.create_superuser("sue", password="pw")
    session = session_start(agent="demo", input="what is (12*7)+3, then save it as a note")
    run_inline(session)
    # A team with a token, for the team page's URLs (no session belongs to it: the roles
    # above are global and see every session, as before teams).
    team = Team.objects.create(name="Elsewhere", slug="elsewhere")
    member = User.objects.create_user("tess", password="pw")
    Membership.objects.create(user=member, team=team, role="operator")
    team_token = ApiToken.issue(member)[0]
    team_token.team = team
    team_token.save()
    return {
        "team_token": team_token,
        "users": {
            "viewer": users["viewer"],
            "operator": users["operator"],
            "staff": staff,
            "superuser": superuser,
            # Model permissions and staff status without a Respawn role open nothing.
            "staff_all_permissions": staff_with_every_permission("stacy"),
            "staff_viewer": staff_with_every_permission("vera", "viewer"),
            "staff_operator": staff_with_every_permission("otto", "operator"),
            "staff_admin": staff_with_every_permission("ada", "admin"),
        },
        "session": session,
        "rule": AlertRule.objects.create(
            name="approvals", reasons="waiting_approval", channel="email", target="ops@example.com"
        ),
    }


def fill(route: str, world) -> list[str]:
    """Concrete URLs for a route pattern (one per action of the dashboard's table for
    <action:action>, one per previewed action for <previewed:action>)."""
    session = world["session"]
    url = "/" + route
    url = url.replace("<uuid:session_id>", str(session.id))
    url = url.replace("<int:rule_id>", str(world["rule"].pk))
    url = url.replace("<int:token_id>", str(world["team_token"].pk))
    for parameter, names in (("<action:action>", ACTIONS), ("<previewed:action>", PREVIEWS)):
        if parameter in url:
            return [url.replace(parameter, name) for name in names]
    return [url]


def expected_dashboard(url: str, role: str) -> set[int]:
    if url in ("/login/",):
        return {200}
    if url == "/logout/":
        return {302, 200, 405}
    if url in ("/sso/login/", "/sso/callback/"):
        # Single sign-on's way in, for anyone; not there without a provider (tests/sso
        # tries them with one).
        return {404}
    if url == "/":
        return {302}
    if url == "/metrics":
        # For Prometheus: a bearer token or a viewer's log-in; no redirect to a log-in page.
        return {401} if role == "anonymous" else {403} if role in NO_ROLE else {200}
    mutating = (
        "/actions/" in url
        or url.endswith("/bulk/")
        or "/preview/" in url
        or url.endswith("/import/")
        or url.endswith("/sessions/new/")  # a form that starts a session: operators only
        or re.search(r"/alerts/\d+/(test|switch|delete)/$", url) is not None
        or url.endswith("/revoke/")
    )
    if role == "anonymous":
        return {302}  # to the login page
    if role in NO_ROLE:
        return {403}
    if mutating and role == "viewer":
        return {403}
    if "/teams/" in url and role in ("viewer", "operator"):
        return {403}  # the team page and its tokens: team admins' and admins'
    if "/teams/tokens/" in url:
        return {302}  # revoked, back to the team page
    return {200, 286, 302, 400, 404, 405, 409}


def request(client, url: str, role: str, world):
    if role != "anonymous":
        client.force_login(world["users"][role])
    if "/actions/" in url or url.endswith(
        ("/bulk/", "/export/", "/test/", "/switch/", "/delete/", "/revoke/")
    ):
        return client.post(
            url, {"checkpoint_seq": 7, "content": "hi", "text": "x", "action": "cancel", "ids": []}
        )
    return client.get(url)


def test_every_dashboard_url_for_every_role(client, world):
    seen = 0
    for route, _pattern in walk(get_resolver().url_patterns):
        if route.startswith(("admin/", "api/")) or route.startswith("static/"):
            continue
        for url in fill(route, world):
            if "<" in url:
                pytest.fail(f"unclassified URL parameter in {route!r}: add it to fill()")
            for role in ROLES:
                client.logout()
                response = request(client, url, role, world)
                allowed = expected_dashboard(url, role)
                assert response.status_code in allowed, (url, role, response.status_code)
                if (
                    role == "anonymous"
                    and response.status_code == 302
                    and url not in ("/", "/logout/", "/metrics")
                ):
                    assert response["Location"].startswith("/login/"), url
                if role == "viewer" and ("/actions/" in url or "/preview/" in url):
                    assert response.status_code == 403
                seen += 1
    assert seen > 100
    # Reading changes nothing; only taking a session out (an export) is recorded.
    assert not (
        AuditEvent.objects.filter(actor__username__in=["victor", "stan", "stacy"])
        .exclude(action="export")
        .exists()
    )


def admin_urls(world) -> list[str]:
    session = world["session"]
    objects = {
        "agentsession": session.pk,
        "checkpoint": Checkpoint.objects.filter(session=session).first().pk,
        "step": Step.objects.filter(session=session).first().pk,
        "auditevent": AuditEvent.objects.filter(session=session).first().pk,
        "apitoken": ApiToken.issue(world["users"]["viewer"])[0].pk,
        "user": world["users"]["viewer"].pk,
        "group": 1,
        "alertrule": world["rule"].pk,
        "team": Team.objects.get(slug="elsewhere").pk,
    }
    urls = []
    for route, _pattern in walk(get_resolver().url_patterns):
        if not route.startswith("admin/"):
            continue
        url = "/" + route
        if "<path:object_id>" in url:
            model = re.search(r"admin/\w+/(\w+)/", url)
            pk = objects.get(model.group(1)) if model else None
            if pk is None:
                continue
            url = url.replace("<path:object_id>", str(pk))
        url = re.sub(r"<[^>]+>", "x", url)
        url = url.replace("^", "").replace("$", "").replace("/?", "/")
        if re.search(r"[()\[\]\\?*+]", url):
            continue  # an optional-argument variant of a regex route already covered
        urls.append(url)
    return urls


def test_admin_refuses_everyone_but_staff_with_a_role(client, world):
    urls = admin_urls(world)
    assert "/admin/" in urls and any(u.startswith("/admin/rq/") for u in urls)
    for url in urls:
        if "logout" in url or url.endswith("login/"):
            continue
        for role in ("anonymous", "viewer", "operator", "staff", "staff_all_permissions"):
            client.logout()
            if role != "anonymous":
                client.force_login(world["users"][role])
            response = client.get(url)
            # 302 to the admin log-in; django-rq's JSON stats answer 401 instead.
            assert response.status_code in (302, 401, 404), (url, role, response.status_code)
            if response.status_code == 302:
                assert "/login/" in response["Location"], (url, role)
        client.force_login(world["users"]["superuser"])
        # Refused even to a superuser by design: autocomplete without its query parameters,
        # and adding or deleting a session's history, audit events or API tokens
        # (sessions_app/admin/registry.py).
        by_design = url.endswith("/autocomplete/") or re.fullmatch(
            r"/admin/sessions_app/"
            r"(agentsession|step|checkpoint|auditevent|apitoken|alertrule|alertdelivery)/"
            r"(add|[^/]+/delete)/",
            url,
        )
        allowed = (200, 302, 404, 403) if by_design else (200, 302, 404)
        assert client.get(url).status_code in allowed, url


def api_operations(client) -> list[tuple[str, str]]:
    from sessions_app.api.routes import api

    spec = api.get_openapi_schema()
    return [(method.upper(), path) for path, item in spec["paths"].items() for method in item]


def test_every_api_operation_for_every_role(client, world):
    session = world["session"]
    tokens = {role: ApiToken.issue(user)[1] for role, user in world["users"].items()}
    operations = api_operations(client)
    assert len(operations) >= 11
    for method, path in operations:
        url = path.replace("{session_id}", str(session.id))
        for role in ROLES:
            headers = (
                {} if role == "anonymous" else {"HTTP_AUTHORIZATION": f"Bearer {tokens[role]}"}
            )
            if method == "GET":
                response = client.get(url, **headers)
            else:
                body = {
                    "checkpoint_seq": 7,
                    "content": "hi",
                    "agent": "echo",
                    "input": "hi",
                    "resolution": "rerun",
                    "hold": True,
                    "note": "case 1",
                    "value": "yes",
                    "to": "someone",  # the work queue's hand
                    "text": "a note",
                }
                if path.endswith("/budgets"):  # refuses names that are not budgets
                    body = {"max_steps": 500}
                response = client.post(url, body, content_type="application/json", **headers)
            code = response.status_code
            if role == "anonymous":
                assert code == 401, (method, url, role, code)
            elif role in NO_ROLE:
                assert code == 403, (method, url, role, code)
            elif role == "viewer":
                # A viewer reads, and may take a session out (an export is a POST).
                reads = method == "GET" or path.endswith("/export")
                assert code == (200 if reads else 403), (method, url, role, code)
            else:
                assert code not in (401, 403, 500), (method, url, role, code)
    # A logged-in browser session is not an API credential.
    client.force_login(world["users"]["superuser"])
    assert client.get("/api/sessions").status_code == 401


def _queue_index(name: str) -> int:
    from django_rq.settings import get_queues_list

    return [q["name"] for q in get_queues_list()].index(name)


def test_only_admins_act_on_the_queues(client, world, rq_queue):
    """Reading the queue dashboard takes staff status and a role; emptying a queue,
    deleting, requeueing or stopping jobs takes the admin role (or a superuser)."""
    from rq import Queue

    queue = Queue(rq_queue.name, connection=rq_queue.connection)
    job = queue.enqueue("sessions_app.workers.jobs.run_session_job", str(world["session"].id))
    index = _queue_index(rq_queue.name)
    reads = ["/admin/rq/", f"/admin/rq/queues/{index}/", f"/admin/rq/queues/{index}/{job.id}/"]
    acts = [
        f"/admin/rq/queues/{index}/empty/",
        f"/admin/rq/queues/{index}/{job.id}/delete/",
        f"/admin/rq/queues/{index}/{job.id}/requeue/",
        f"/admin/rq/queues/{index}/requeue-all/",
        f"/admin/rq/queues/{index}/failed/clear/",
        f"/admin/rq/queues/actions/{index}/",
    ]
    for role in ("staff", "staff_all_permissions", "staff_viewer", "staff_operator"):
        client.force_login(world["users"][role])
        for url in reads:
            code = client.get(url).status_code
            assert code == (200 if role in ("staff_viewer", "staff_operator") else 302), (url, role)
        for url in acts:
            get, post = client.get(url), client.post(url, {"action": "delete", "job_ids": [job.id]})
            allowed = (403,) if role in ("staff_viewer", "staff_operator") else (302,)
            assert get.status_code in allowed and post.status_code in allowed, (url, role)
        assert queue.count == 1 and queue.fetch_job(job.id) is not None, role
    client.force_login(world["users"]["staff_admin"])
    assert client.get(acts[0]).status_code == 200  # the confirmation page
    assert client.post(acts[0]).status_code == 302
    assert queue.count == 0


def test_queue_pages_answer_404_not_500_for_what_does_not_exist(client, world, rq_queue):
    client.force_login(world["users"]["superuser"])
    index = _queue_index(rq_queue.name)
    for url in [
        "/admin/rq/queues/99/",
        "/admin/rq/queues/99/failed/",
        f"/admin/rq/queues/{index}/no-such-job/",
        f"/admin/rq/queues/{index}/no-such-job/delete/",
        f"/admin/rq/queues/{index}/no-such-job/requeue/",
        f"/admin/rq/queues/{index}/no-such-job/enqueue/",
        f"/admin/rq/queues/{index}/no-such-job/results/r1/",
        "/admin/rq/workers/99/",
        f"/admin/rq/workers/{index}/no-such-worker/",
        "/admin/rq/cron-schedulers/99/s/",
    ]:
        assert client.get(url).status_code == 404, url
    response = client.post(
        f"/admin/rq/queues/actions/{index}/",
        {"action": "delete", "job_ids": ["no-such-job"], "next_url": "https://elsewhere.example/"},
    )
    assert response.status_code in (302, 404)
    if response.status_code == 302:
        assert response["Location"].startswith("/admin/rq/")
    # The index links to the one mounted dashboard.
    assert client.get("/admin/django_rq/dashboard/")["Location"] == "/admin/rq/"


def test_the_admin_with_a_role_reads_and_only_operators_change(client, world):
    """Staff with every model permission: a viewer's role reads the admin's records and
    changes none of them; an operator's edits history; accounts and groups are for
    admins."""
    session = world["session"]
    step = Step.objects.filter(session=session, kind="tool_result").first()
    change = f"/admin/sessions_app/step/{step.pk}/change/"
    client.force_login(world["users"]["staff_viewer"])
    assert client.get(change).status_code == 200
    response = client.post(change, {"payload": json.dumps({**step.payload, "output": 1})})
    assert response.status_code == 403
    title_change = f"/admin/sessions_app/agentsession/{session.pk}/change/"
    assert client.post(title_change, {"title": "renamed"}).status_code == 403
    assert client.get("/admin/sessions_app/apitoken/add/").status_code == 403
    for url in ("/admin/auth/user/", "/admin/auth/group/", "/admin/auth/user/add/"):
        assert client.get(url).status_code == 403, url
    step.refresh_from_db()
    assert step.payload.get("output") != 1
    client.force_login(world["users"]["staff_operator"])
    for url in ("/admin/auth/user/", "/admin/auth/group/"):
        assert client.get(url).status_code == 403, url
    client.force_login(world["users"]["staff_admin"])
    assert client.get("/admin/auth/user/").status_code == 200
