"""Retention archives to an object store (S3's API) before it deletes: the signing checked
against AWS's published Signature Version 4 examples, a real HTTP store that verifies every
request, an archive that imports back, and a refusing store that stops the deletion."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from sessions_app.checks import check_retention
from sessions_app.models import AgentSession, AuditEvent, Step
from sessions_app.services.core import session_start
from sessions_app.upkeep.archive import ArchiveError, S3Archive, S3Credentials, _sha256, sign_v4
from sessions_app.upkeep.retention import PolicyError, apply_retention, parse_policy
from sessions_app.upkeep.transfer import import_session

from ..conftest import run_inline
from ..stubs.s3_server import S3Stub

pytestmark = pytest.mark.django_db(transaction=True)

KEY, SECRET = "AKIDRESPAWNTEST", "respawn/test/secret+key"


# --- Signature Version 4, as AWS documents it ------------------------------------------------


@pytest.mark.parametrize(
    "url, signature",
    [
        # AWS's Signature Version 4 test suite: get-vanilla, get-vanilla-query-order-key-case.
        (
            "https://example.amazonaws.com/",
            "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
        ),
        (
            "https://example.amazonaws.com/?Param2=value2&Param1=value1",
            "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500",
        ),
    ],
)
def test_requests_are_signed_as_aws_documents_it(url, signature):
    signed = sign_v4(
        method="GET",
        url=url,
        headers={},
        payload_hash=_sha256(b""),
        access_key="AKIDEXAMPLE",
        secret_key="wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        region="us-east-1",
        service="service",
        now=datetime(2015, 8, 30, 12, 36, tzinfo=UTC),
    )
    assert signed["X-Amz-Date"] == "20150830T123600Z"
    assert signed["Authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, "
        f"SignedHeaders=host;x-amz-date, Signature={signature}"
    )


# --- Against a store -------------------------------------------------------------------------


@pytest.fixture
def store(monkeypatch):
    stub = S3Stub(KEY, SECRET, region="eu-west-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("RESPAWN_ARCHIVE_S3_ENDPOINT", stub.endpoint)
    yield stub
    stub.close()


def old_finished_session(text: str) -> AgentSession:
    session = run_inline(session_start(agent="demo", input=text))
    AgentSession.objects.filter(id=session.id).update(
        updated_at=timezone.now() - timedelta(days=40)
    )
    return session


POLICY = {"default": {"delete_after_days": 30}, "archive_dir": "s3://respawn-archive/prod/v1"}


def test_sessions_are_archived_to_the_store_then_deleted_and_the_archive_imports(store):
    sessions = [old_finished_session(f"what is {n}*7") for n in (2, 3)]
    steps = {s.id: Step.objects.filter(session=s).count() for s in sessions}

    summary = apply_retention(parse_policy(POLICY))

    assert summary.deleted_sessions.sessions == 2
    assert not AgentSession.objects.filter(id__in=[s.id for s in sessions]).exists()
    assert len(store.objects) == 2
    for session in sessions:
        (key,) = [k for k in store.objects if f"/{session.id}/" in k]
        assert key.startswith("respawn-archive/prod/v1/") and key.endswith("-deleted.jsonl.gz")
        location = f"s3://{key}"
        assert location in summary.archived
        event = AuditEvent.objects.get(session_id=session.id, action="retention_delete")
        assert event.after["archive"] == location
        back = import_session(store.objects[key]).session
        assert (
            back.id == session.id and Step.objects.filter(session=back).count() == steps[session.id]
        )
    # Every object was put, then confirmed.
    assert [m for m, _ in store.requests] == ["PUT", "HEAD", "PUT", "HEAD"]


def test_a_store_that_refuses_stops_the_deletion_and_says_why(store):
    session = old_finished_session("what is 4*7")
    store.fail_with = (403, "AccessDenied", "the bucket policy forbids this")
    out = StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("apply_retention", "--policy", _json(POLICY), stdout=out)
    assert "archiving failed, so the batch it was for was not deleted" in str(caught.value)
    assert "403 AccessDenied: the bucket policy forbids this" in str(caught.value)
    assert AgentSession.objects.filter(id=session.id).exists()
    assert not AuditEvent.objects.filter(action="retention_delete").exists()

    store.fail_with = None  # the store is back: running it again archives and deletes
    call_command("apply_retention", "--policy", _json(POLICY), stdout=out)
    assert not AgentSession.objects.filter(id=session.id).exists()
    assert "archived 1 export file(s) first" in out.getvalue()


def test_a_wrong_secret_is_refused_by_the_store(store, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    session = old_finished_session("what is 5*7")
    with pytest.raises(ArchiveError, match="403 SignatureDoesNotMatch"):
        apply_retention(parse_policy(POLICY))
    assert AgentSession.objects.filter(id=session.id).exists()


def test_an_unreachable_store_is_an_archive_error_naming_it():
    archive = S3Archive(
        "s3://bucket-x/p",
        S3Credentials(KEY, SECRET, endpoint="http://127.0.0.1:9", region="us-east-1"),
        timeout=2,
    )
    with pytest.raises(ArchiveError, match=r"PUT http://127.0.0.1:9/bucket-x/p/k: "):
        archive.write("k", lambda out: out.write(b"data"))


def test_an_s3_archive_without_credentials_is_refused_before_anything_runs(settings, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    settings.RESPAWN_RETENTION = POLICY
    (error,) = check_retention()
    assert error.id == "respawn.E020"
    assert "needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in error.msg
    with pytest.raises(PolicyError, match="is not s3://bucket"):
        parse_policy({**POLICY, "archive_dir": "s3://Bad_Bucket"})


def _json(value) -> str:
    import json

    return json.dumps(value)
