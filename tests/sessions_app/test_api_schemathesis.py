"""Property-based, over every operation of /api/openapi.json, with every check schemathesis
has enabled by default: no 5xx, only documented status codes, content types and response
shapes, schema-valid requests accepted (2xx, or 401/403/404/409 for what the data says)
and schema-invalid ones refused (4xx), authentication never ignored, no unsupported method
served. Requests are generated both to fit the schema and not to."""

import json

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, settings
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.generation.modes import GenerationMode

from sessions_app.api.routes import api
from sessions_app.models import AgentSession, ApiToken, Step
from sessions_app.upkeep.transfer import export_bytes

# The schema the API serves (to people and programs it knows: sessions_app.api.routes), as
# from_wsgi would load it, without a token to fetch it with before the database exists.
app = get_wsgi_application()
schema = schemathesis.openapi.from_dict(json.loads(json.dumps(api.get_openapi_schema())))
schema.app = app
schema.location = "/api/openapi.json"
load_all_checks()
ALL_CHECKS = list(CHECKS.get_all())


@schema.hook
def map_case(context, case):
    """Values only this API makes: a list cursor is one it returned, an import is a file it
    exported (any other is a 400, which a generator that follows the schema cannot know).
    Schema-valid cases page from the start and import a real export; schema-invalid ones
    keep their junk."""
    meta = case.meta
    positive = meta is not None and meta.generation.mode == GenerationMode.POSITIVE
    if positive and case.query and "cursor" in case.query:
        case.query = {k: v for k, v in case.query.items() if k != "cursor"}
    if positive and case.operation.label == "POST /api/imports" and EXPORT:
        case.body = EXPORT[0]
    return case


EXPORT: list[bytes] = []  # a real export file, once a test has a database to make it from


@schema.hook
def filter_case(context, case):
    """Cases made before a test has a database (when the tests are collected) cannot hold
    a real export: no schema-valid import is sent with a made-up file."""
    meta = case.meta
    positive = meta is not None and meta.generation.mode == GenerationMode.POSITIVE
    return not (positive and case.operation.label == "POST /api/imports" and not EXPORT)


@pytest.fixture
def operator_token(users):
    return ApiToken.issue(users["operator"])[1]


@pytest.fixture
def some_sessions(db):
    """Real rows so that generated ids sometimes hit and lists are not empty."""
    session = AgentSession.objects.create(agent="demo", title="existing", last_seq=1, step_count=1)
    Step.objects.create(session=session, seq=1, kind="user", payload={"text": "hi"})
    EXPORT[:] = [export_bytes(session)]
    return session


def test_every_operation_and_every_check_is_covered():
    operations = {op.ok().label for op in schema.get_all_operations()}
    assert len(operations) >= 11 and "POST /api/sessions/{session_id}/approve" in operations
    names = {check.__name__ for check in ALL_CHECKS}
    assert {"positive_data_acceptance", "negative_data_rejection", "ignored_auth"} <= names
    assert len(names) >= 14


@pytest.mark.django_db(transaction=True)
@schema.parametrize()
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)
def test_no_input_breaks_the_api_contract(case, operator_token, some_sessions):
    """A real token replaces the generated Authorization header. A schema-invalid case that
    leaves that required header out is sent without it, as generated: adding the token
    would make it a valid request that the API rightly accepts."""
    meta = case.meta
    negative = meta is not None and meta.generation.mode == GenerationMode.NEGATIVE
    given = {name.lower() for name in (case.headers or {})}
    headers = {"Authorization": f"Bearer {operator_token}"}
    if negative and "authorization" not in given:
        headers = {}
    case.call_and_validate(headers=headers, checks=ALL_CHECKS)
