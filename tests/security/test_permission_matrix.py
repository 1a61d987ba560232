"""Every URL of the dashboard, the admin and the API, for every kind of user.

The URL list comes from the URL resolver (and, for the API, from its OpenAPI document), so a
new view that nobody classified here fails this test instead of shipping unchecked."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.urls import URLPattern, URLResolver, get_resolver

from agent_runtime.loop import run_session
from sessions_app.models import ApiToken, AuditEvent, Checkpoint, Step
from sessions_app.runtime import agent_registry, run_config
from sessions_app.services import session_start
from sessions_app.store import DjangoEffects, DjangoSessionStore

pytestmark = pytest.mark.django_db

ROLES = ["anonymous", "viewer", "operator", "staff", "superuser"]
DASHBOARD_ACTIONS = [
    "hold",
    "release",
    "resume",
    "cancel",
    "rollback",
    "fork",
    "approve",
    "reject",
    "message",
    "instruct",
    "correct",
]


def walk(patterns, prefix=""):
    for p in patterns:
        if isinstance(p, URLResolver):
            yield from walk(p.url_patterns, prefix + str(p.pattern))
        elif isinstance(p, URLPattern):
            yield prefix + str(p.pattern), p


@pytest.fixture
def world(users):
    staff = User.objects.create_user("stan", password="pw", is_staff=True)
    superuser = User.objects.create_superuser("sue", password="pw")
    session = session_start(agent="demo", input="what is (12*7)+3, then save it as a note")
    run_session(
        str(session.id),
        store=DjangoSessionStore(),
        agents=agent_registry(),
        effects=DjangoEffects(),
        config=run_config(),
    )
    return {
        "users": {
            "viewer": users["viewer"],
            "operator": users["operator"],
            "staff": staff,
            "superuser": superuser,
        },
        "session": session,
    }


def fill(route: str, world) -> list[str]:
    """Concrete URLs for a route pattern (one per action for <str:action>)."""
    session = world["session"]
    url = "/" + route
    url = url.replace("<uuid:session_id>", str(session.id))
    if "<str:action>" in url:
        return [url.replace("<str:action>", a) for a in DASHBOARD_ACTIONS + ["no-such-action"]]
    return [url]


def expected_dashboard(url: str, role: str) -> set[int]:
    if url in ("/login/",):
        return {200}
    if url == "/logout/":
        return {302, 200, 405}
    if url == "/":
        return {302}
    mutating = (
        "/actions/" in url
        or url.endswith("/bulk/")
        or "/preview/" in url
        or url.endswith("/import/")
    )
    if role == "anonymous":
        return {302}  # to the login page
    if role in ("staff",):  # staff without a dashboard role
        return {403}
    if mutating and role == "viewer":
        return {403}
    return {200, 286, 302, 400, 404, 405, 409}


def request(client, url: str, role: str, world):
    if role != "anonymous":
        client.force_login(world["users"][role])
    if "/actions/" in url or url.endswith("/bulk/"):
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
                    and url not in ("/", "/logout/")
                ):
                    assert response["Location"].startswith("/login/"), url
                if role == "viewer" and ("/actions/" in url or "/preview/" in url):
                    assert response.status_code == 403
                seen += 1
    assert seen > 100
    # Reading changes nothing; only taking a session out (an export) is recorded.
    assert not (
        AuditEvent.objects.filter(actor__username__in=["victor", "stan"])
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


def test_admin_refuses_everyone_but_staff(client, world):
    urls = admin_urls(world)
    assert "/admin/" in urls and any(u.startswith("/admin/rq/") for u in urls)
    for url in urls:
        if "logout" in url or url.endswith("login/"):
            continue
        for role in ("anonymous", "viewer", "operator"):
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
        # add/change of django-rq's placeholder "dashboard" model, and adding or deleting
        # a session's history, audit events or API tokens (sessions_app/admin.py).
        by_design = (
            url.endswith("/autocomplete/")
            or url.startswith("/admin/django_rq/dashboard/")
            or re.fullmatch(
                r"/admin/sessions_app/(agentsession|step|checkpoint|auditevent)/add/", url
            )
            or re.fullmatch(r"/admin/sessions_app/\w+/[^/]+/delete/", url)
        )
        allowed = (200, 302, 404, 403) if by_design else (200, 302, 404)
        assert client.get(url).status_code in allowed, url


def api_operations(client) -> list[tuple[str, str]]:
    spec = client.get("/api/openapi.json").json()
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
                response = client.post(
                    url,
                    {
                        "checkpoint_seq": 7,
                        "content": "hi",
                        "agent": "echo",
                        "input": "hi",
                        "resolution": "rerun",
                        "hold": True,
                        "note": "case 1",
                        "value": "yes",
                    },
                    content_type="application/json",
                    **headers,
                )
            code = response.status_code
            if role == "anonymous":
                assert code == 401, (method, url, role, code)
            elif role == "staff":
                assert code == 403, (method, url, role, code)
            elif role == "viewer":
                assert code == (200 if method == "GET" else 403), (method, url, role, code)
            else:
                assert code not in (401, 403, 500), (method, url, role, code)
    # A logged-in browser session is not an API credential.
    client.force_login(world["users"]["superuser"])
    assert client.get("/api/sessions").status_code == 401
