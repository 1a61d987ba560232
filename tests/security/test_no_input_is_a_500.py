"""Property: no input makes any page or API operation answer 5xx.

Every form and every query parameter the dashboard and the admin offer (found by reading
their pages, tests/security/crawl.py) and every field of every API operation (from the
OpenAPI document) gets generated junk: control characters, non-ASCII digits, numbers past
any column, impossible and extreme dates, deep and broken JSON, huge and empty values.
Anything but a 5xx is fine; a 5xx (or an exception) fails with the request that made it."""

from __future__ import annotations

import json
from datetime import date

import pytest
from django.contrib.auth.models import User
from django.urls import Resolver404, resolve
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessions_app.models import AgentSession, ApiToken, Status
from sessions_app.services.core import checkpoint_rollback, session_start
from sessions_app.store import DjangoEffects, session_store
from tests.sessions_app.test_dashboard import _uncertain_notify_session

from ..conftest import run_inline
from .crawl import Target, crawl

pytestmark = pytest.mark.django_db

EXAMPLES = 12  # per form, per link shape, per API operation

NASTY = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "\x1b[31mred\x1b[0m",
    "\x7f",
    "\u0085",
    "line\nbreak",
    "²",
    "١٢",
    "٣٤٥",
    "-1",
    "0",
    "+7",
    " 7 ",
    "007",
    "2147483648",
    "9" * 40,
    "1e999",
    "NaN",
    "Infinity",
    "-0",
    "9999-12-31",
    "0001-01-01",
    "10000-01-01",
    "2024-02-30",
    "2024-W01-1",
    "20240101",
    "2024-01-01T00:00:00+14:00",
    "[" * 300,
    '{"a":' * 200,
    json.dumps(json.loads("[" * 60 + "]" * 60)),
    "{}",
    "[]",
    "null",
    '"x"',
    "true",
    '{"a": "\\u0000"}',
    '{"output": NaN}',
    "' OR 1=1 --",
    "<script>alert(1)</script>",
    "../../etc/passwd",
    "\ufeff",
    "𝐯𝐢𝐞𝐰𝐞𝐫",
    "x" * 20_000,
    "%00",
    "00000000-0000-0000-0000-000000000000",
    "not-a-uuid",
    "head",
    "-updated",
]
_no_surrogates = st.characters(exclude_categories=["Cs"])
JUNK = st.one_of(
    st.sampled_from(NASTY),
    st.text(_no_surrogates, max_size=40),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.dates(min_value=date(1, 1, 1)).map(date.isoformat),
)


def _is_server_error(status: int) -> bool:
    return status >= 500


@pytest.fixture
def world(users, rq_queue):
    """Sessions in the states whose pages hold every form: a finished one with
    checkpoints, one waiting for an approval, one with an uncertain call, a paused one."""
    superuser = User.objects.create_superuser("sue", password="pw")
    store, effects = session_store(), DjangoEffects()

    def run(session):
        return run_inline(session, store=store, effects=effects)

    done = run(session_start(agent="demo", input="what is (12*7)+3, then save it as a note"))
    waiting = run(session_start(agent="approval", input="pay invoice INV-1 to ACME"))
    paused = run(session_start(agent="demo", input="what is 2**10, then save it as a note"))
    first = paused.checkpoints.order_by("seq").values_list("seq", flat=True).first()
    checkpoint_rollback(session_id=paused.id, checkpoint_seq=first)
    uncertain = _uncertain_notify_session()
    ApiToken.issue(users["viewer"], name="a token")
    assert AgentSession.objects.get(id=waiting.id).status == Status.WAITING_INPUT
    return {"superuser": superuser, "sessions": [done, waiting, paused, uncertain]}


def _route(path: str) -> str:
    """A path's view, and its arguments but the ids of objects (`sessions:action resume`
    and `sessions:action cancel` are two routes; step 7's and step 8's admin page one)."""
    try:
        match = resolve(path)
    except Resolver404:
        return path
    named = sorted(
        f"{key}={value}"
        for key, value in match.kwargs.items()
        if isinstance(value, str) and key not in ("object_id", "job_id", "key")
    )
    return " ".join([match.view_name or match.route, *named])


def _allowed(path: str) -> bool:
    # Leaving (log out), deleting accounts and setting passwords would end the crawl's
    # own session; none of them reads anything a form could break.
    return not any(part in path for part in ("logout", "/delete/", "/password/", "/static/"))


def site_targets(client, world) -> list[Target]:
    def fetch(url: str) -> tuple[int, str, str]:
        response = client.get(url)
        assert not _is_server_error(response.status_code), url
        content_type = response.get("Content-Type", "")
        body = response.content.decode() if content_type.startswith("text/") else ""
        return response.status_code, content_type, body

    start = ["/sessions/", "/sessions/attention/", "/audit/", "/admin/", "/admin/rq/"]
    for session in world["sessions"]:
        start.append(f"/sessions/{session.id}/")
        # A fragment pages link only past their first page of steps.
        start.append(f"/sessions/{session.id}/steps/?after=0")
        start.append(f"/admin/sessions_app/agentsession/{session.id}/change/")
    return crawl(fetch, start, allowed=_allowed, route=_route)


def _submit(client, target: Target, fields: dict[str, list[str]], agent: str):
    if target.method == "GET":
        return client.get(target.path, fields, HTTP_USER_AGENT=agent)
    return client.post(target.path, fields, HTTP_USER_AGENT=agent)


def _short(fields: dict[str, list[str]]) -> dict[str, list[str]]:
    return {k: [v[:80] for v in values] for k, values in fields.items()}


def _fuzz(client, target: Target, examples: int) -> None:
    names = sorted(target.fields) + ["unexpected"]

    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(
        chosen=st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True),
        values=st.lists(st.lists(JUNK, min_size=1, max_size=3), min_size=3, max_size=3),
        agent=JUNK,
    )
    def check(chosen, values, agent):
        fields = {name: list(default[:1]) for name, default in target.fields.items()}
        for name, junk in zip(chosen, values, strict=False):
            fields[name] = junk
        try:
            response = _submit(client, target, fields, agent.replace("\n", " "))
        except Exception as exc:  # the test client re-raises what a view raised
            raise AssertionError(
                f"{target.method} {target.path} {_short(fields)}: {exc!r}"
            ) from exc
        assert not _is_server_error(response.status_code), (target.path, _short(fields))

    check()


def test_no_form_or_query_parameter_of_the_site_is_a_500(client, world):
    client.force_login(world["superuser"])
    targets = site_targets(client, world)
    routes = {_route(t.path) for t in targets} | {_route(t.path).split()[0] for t in targets}
    # The crawl found the forms and parameters that matter (and new ones as they come).
    for expected in [
        "sessions:list",
        "sessions:action action=approve",
        "sessions:action action=reject",
        "sessions:action action=uncertain",
        "sessions:action action=correct",
        "sessions:action action=rollback",
        "sessions:bulk",
        "sessions:steps",
        "sessions:timeline",
        "sessions:import",
        "sessions:diff",
        "sessions:preview",
        "audit",
        "admin:sessions_app_step_change",
        "admin:sessions_app_checkpoint_change",
        "admin:sessions_app_agentsession_changelist",
        "admin:sessions_app_apitoken_add",
        "django_rq:jobs",
    ]:
        assert expected in routes, f"the crawl did not reach {expected}"
    posts = [t for t in targets if t.method == "POST"]
    assert len(posts) >= 10 and sum(len(t.fields) for t in targets) >= 40
    for target in targets:
        client.force_login(world["superuser"])
        _fuzz(client, target, EXAMPLES)


def test_the_log_in_forms_take_any_input_without_a_500(client, world):
    for path in ("/login/", "/admin/login/"):
        target = Target(path, "POST", {"username": ["olivia"], "password": ["x"]})
        _fuzz(client, target, EXAMPLES * 2)


# --- The API ------------------------------------------------------------------------------------

JSON_JUNK = st.recursive(
    st.one_of(
        JUNK,
        st.integers(min_value=-(2**80), max_value=2**80),
        st.floats(allow_nan=False),
        st.booleans(),
        st.none(),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
RAW_BODIES = st.sampled_from(
    [
        "[]",
        "null",
        '"text"',
        "7",
        "[" * 5000 + "]" * 5000,
        '{"a":' * 100 + "1" + "}" * 100,
        '{"reason": NaN}',
        '{"content": "x\\u0000"}',
        "{not json",
        "\xff\xfe",
        '{"checkpoint_seq": 1e999}',
    ]
)


def test_no_api_field_is_a_500(client, world, users):
    token = ApiToken.issue(users["operator"])[1]
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    spec = client.get("/api/openapi.json", **auth).json()
    session_ids = [str(s.id) for s in world["sessions"]] + ["00000000-0000-0000-0000-000000000000"]
    operations = [
        (method, path, op) for path, item in spec["paths"].items() for method, op in item.items()
    ]
    assert len(operations) >= 11

    for method, path, operation in operations:
        _fuzz_operation(client, auth, spec, session_ids, method, path, operation)


def _fuzz_operation(client, auth, spec, session_ids, method, path, operation) -> None:
    params = [p["name"] for p in operation.get("parameters", []) if p["in"] == "query"]
    body_ref = (
        operation.get("requestBody", {})
        .get("content", {})
        .get("application/json", {})
        .get("schema", {})
        .get("$ref", "")
    )
    schemas = spec["components"]["schemas"]
    body_fields = list(schemas.get(body_ref.rsplit("/", 1)[-1], {}).get("properties", {}))

    @settings(
        max_examples=EXAMPLES * 2,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(
        session_id=st.sampled_from(session_ids),
        query=st.dictionaries(st.sampled_from(params or ["x"]), JUNK, max_size=3),
        body=st.one_of(
            st.dictionaries(st.sampled_from(body_fields or ["x"]), JSON_JUNK, max_size=4).map(
                json.dumps
            ),
            RAW_BODIES,
        ),
    )
    def check(session_id, query, body):
        url = path.replace("{session_id}", session_id)
        if method == "get":
            response = client.get(url, query, **auth)
        else:
            response = client.post(url, body, content_type="application/json", **auth)
        assert not _is_server_error(response.status_code), (method, url, query, body[:200])
        if response.status_code >= 400:  # an error names the problem, as JSON
            assert response["Content-Type"].startswith("application/json"), (method, url)

    check()


def test_a_json_body_that_is_not_an_object_changes_nothing(client, world, users):
    """approve and reject once took `[]` or `null` for "no reason" and approved."""
    token = ApiToken.issue(users["operator"])[1]
    waiting = world["sessions"][1]
    for body in ("[]", "null", '"yes"', "1", "true"):
        for action in ("approve", "reject"):
            response = client.post(
                f"/api/sessions/{waiting.id}/{action}",
                body,
                content_type="application/json",
                HTTP_AUTHORIZATION=f"Bearer {token}",
            )
            assert response.status_code == 400, (action, body)
            assert "must be a JSON object" in response.json()["detail"]
    waiting.refresh_from_db()
    assert waiting.status == Status.WAITING_INPUT


def test_api_query_parameters_are_declared_and_single(client, users):
    token = ApiToken.issue(users["viewer"])[1]
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    response = client.get("/api/sessions?stauts=failed", **auth)
    assert response.status_code == 400 and "'stauts'" in response.json()["detail"]
    response = client.get("/api/sessions?status=failed&status=queued", **auth)
    assert response.status_code == 400 and "given 2 times" in response.json()["detail"]
    response = client.get("/api/sessions?=failed", **auth)
    assert response.status_code == 400 and "no name" in response.json()["detail"]
    assert client.get("/api/sessions?status=failed&limit=5", **auth).status_code == 200


def test_no_date_part_in_an_admin_lists_query_string_is_a_500(client, world):
    """The date hierarchy's drill-down and any `<date field>__<part>` a URL names, on every
    list the admin has (Respawn's and Django's own): a year Python cannot hold is a bad
    parameter, not a 500 when the query runs."""
    from django.contrib import admin
    from django.db import models

    client.force_login(world["superuser"])
    tried = 0
    for model in admin.site._registry:
        url = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
        dates = [
            f.name
            for f in model._meta.get_fields()
            if isinstance(f, models.DateField) and getattr(f, "concrete", False)
        ]
        for name in dates:
            for query in (
                {f"{name}__year": "99999"},
                {f"{name}__year": "0"},
                {f"{name}__year__gt": "-1"},
                {f"{name}__iso_year": "10000"},
                {f"{name}__year": "2026", f"{name}__month": "13"},
                {f"{name}__year": "2026", f"{name}__month": "2", f"{name}__day": "2147483648"},
                {f"{name}__quarter": "x"},
                {f"{name}__year__in": "2026,99999"},
            ):
                response = client.get(url, query)
                assert response.status_code < 500, (url, query, response.status_code)
                tried += 1
    assert tried >= 80
