"""Property-based: no input makes the API answer 5xx (schemathesis over /api/openapi.json)."""

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from sessions_app.models import AgentSession, ApiToken, Step

schema = schemathesis.openapi.from_wsgi("/api/openapi.json", get_wsgi_application())


@pytest.fixture
def operator_token(users):
    return ApiToken.issue(users["operator"])[1]


@pytest.fixture
def some_sessions(db):
    """Real rows so that generated ids sometimes hit and lists are not empty."""
    session = AgentSession.objects.create(agent="demo", title="existing", last_seq=1, step_count=1)
    Step.objects.create(session=session, seq=1, kind="user", payload={"text": "hi"})
    return session


@pytest.mark.django_db(transaction=True)
@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_no_input_causes_a_server_error(case, operator_token, some_sessions):
    response = case.call(headers={"Authorization": f"Bearer {operator_token}"})
    case.validate_response(response, checks=[not_a_server_error])
