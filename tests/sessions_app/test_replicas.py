"""Which reads may go to the read replica (sessions_app.web.replicas); the real replica, lagging
and down, is in tests/scale/test_replica.py."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.http import HttpResponse
from django.test import RequestFactory

from sessions_app.models import AgentSession, ApiToken, AuditEvent, LoginFailure, Step
from sessions_app.web import replicas

router = replicas.ReplicaRouter()


def test_reads_go_to_the_primary_outside_a_read_only_page():
    assert router.db_for_read(AgentSession) is None
    assert router.db_for_write(AgentSession) == "default"


def test_read_only_pages_read_respawns_data_from_the_replica():
    with replicas.replica_reads():
        for model in (AgentSession, Step, AuditEvent):
            assert router.db_for_read(model) == "replica"
        # A log-in, a token just issued, a failed log-in: always what was just written.
        for model in (User, ApiToken, LoginFailure):
            assert router.db_for_read(model) is None
        assert router.db_for_write(AgentSession) == "default"
    assert router.db_for_read(AgentSession) is None


@pytest.mark.django_db(transaction=True)
def test_a_read_in_a_transaction_sees_its_writes():
    with replicas.replica_reads(), transaction.atomic():
        assert router.db_for_read(AgentSession) is None


@pytest.fixture
def lag(monkeypatch):
    measured = {"value": 0.0}
    monkeypatch.setattr(replicas, "replica_lag", lambda: measured["value"])
    monkeypatch.setattr(replicas, "configured", lambda: True)
    return measured


@pytest.mark.parametrize(
    ("method", "path", "cookie", "expected"),
    [
        ("GET", "/sessions/", False, True),
        ("GET", "/sessions/0b0c5f5e-58a4-4f39-9d8e-6a1b1a0e9f11/", False, True),
        ("HEAD", "/audit/", False, True),
        ("GET", "/api/sessions", False, True),
        ("GET", "/sessions/0b0c5f5e-58a4-4f39-9d8e-6a1b1a0e9f11/", True, False),  # just wrote
        ("GET", "/sessions/0b0c5f5e-58a4-4f39-9d8e-6a1b1a0e9f11/preview/resume/", False, False),
        ("GET", "/sessions/bulk/", False, False),
        ("POST", "/api/sessions", False, False),
        ("GET", "/admin/sessions_app/agentsession/", False, False),
        ("GET", "/login/", False, False),
    ],
)
def test_which_requests_read_the_replica(lag, method, path, cookie, expected):
    request = RequestFactory().generic(method, path)
    if cookie:
        request.COOKIES[replicas.STICKY_COOKIE] = "1"
    assert replicas.reads_from_replica(request) is expected


def test_a_lagging_or_silent_replica_is_not_read(lag, settings):
    settings.RESPAWN_REPLICA_MAX_LAG = 5
    request = RequestFactory().get("/sessions/")
    lag["value"] = 4.9
    assert replicas.reads_from_replica(request)
    lag["value"] = 5.1
    assert not replicas.reads_from_replica(request)
    lag["value"] = None
    assert not replicas.reads_from_replica(request)


def test_a_write_keeps_its_client_on_the_primary_for_a_while(lag, settings):
    settings.RESPAWN_REPLICA_STICKY = 7
    middleware = replicas.ReplicaReadsMiddleware(lambda request: HttpResponse("ok"))
    response = middleware(RequestFactory().post("/sessions/x/actions/cancel/"))
    assert response[replicas.READS_HEADER] == "primary"
    assert response.cookies[replicas.STICKY_COOKIE]["max-age"] == 7
    response = middleware(RequestFactory().get("/sessions/"))
    assert response[replicas.READS_HEADER] == "replica"
    assert replicas.STICKY_COOKIE not in response.cookies
