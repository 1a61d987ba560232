"""The JSON API: every endpoint, its permissions, and its errors."""

from __future__ import annotations

import uuid

import pytest

from sessions_app.models import AgentSession, ApiToken, AuditEvent, Step
from sessions_app.store import session_store

from ..conftest import run_inline

pytestmark = pytest.mark.django_db


def start(call, agent="demo", text="what is (12*7)+3, then save it as a note"):
    response = call("post", "/api/sessions", body={"agent": agent, "input": text})
    assert response.status_code == 201, response.content
    return response.json()


def test_token_is_hashed_at_rest(users):
    token, raw = ApiToken.issue(users["operator"])
    assert raw.startswith("rsp_") and len(raw) > 40
    token.refresh_from_db()
    assert raw not in (token.key_hash, token.key_prefix)
    assert token.key_hash == ApiToken.hash(raw)


@pytest.mark.parametrize(
    "header", [None, "Bearer nope", "Basic abc", "Bearer ", "bearer rsp_" + "x" * 40]
)
def test_missing_or_bad_token_is_401(client, header):
    extra = {"HTTP_AUTHORIZATION": header} if header else {}
    response = client.get("/api/sessions", **extra)
    assert response.status_code == 401
    assert response.json()["error"] == "unauthorized"


def test_revoked_token_is_401(client, users):
    from django.utils import timezone

    token, raw = ApiToken.issue(users["operator"])
    token.revoked_at = timezone.now()
    token.save()
    assert client.get("/api/sessions", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 401


def test_start_poll_and_read_steps(call):
    created = start(call)
    assert created["status"] == "queued" and created["agent"] == "demo"
    run_inline(created["id"])
    session = call("get", f"/api/sessions/{created['id']}", role="viewer").json()
    assert session["status"] == "completed"
    assert session["final_answer"].startswith("(12*7)+3 = 87")
    assert session["head"] == 13 and session["counters"]["steps"] == 13

    first = call("get", f"/api/sessions/{created['id']}/steps?limit=5", role="viewer").json()
    assert [s["seq"] for s in first["items"]] == [1, 2, 3, 4, 5]
    assert first["next"] == 5
    rest = call(
        "get", f"/api/sessions/{created['id']}/steps?after=5&limit=100", role="viewer"
    ).json()
    assert [s["seq"] for s in rest["items"]] == list(range(6, 14))
    assert rest["next"] is None
    step = first["items"][0]
    assert set(step) >= {"seq", "kind", "payload", "superseded", "started_at", "finished_at"}
    assert step["kind"] == "user" and step["payload"] == {
        "content": [{"type": "text", "text": "what is (12*7)+3, then save it as a note"}]
    }


def test_second_message_continues_the_conversation(call):
    created = start(call)
    run_inline(created["id"])
    response = call(
        "post", f"/api/sessions/{created['id']}/messages", body={"content": "what is 6*7?"}
    )
    assert response.status_code == 202
    assert response.json()["status"] == "queued"
    run_inline(created["id"])
    session = call("get", f"/api/sessions/{created['id']}").json()
    assert session["status"] == "completed" and session["final_answer"] == "6*7 = 42."


def test_viewer_can_read_but_not_act(call):
    created = start(call)
    assert call("get", f"/api/sessions/{created['id']}", role="viewer").status_code == 200
    for path, body in [
        ("/api/sessions", {"agent": "demo", "input": "hi"}),
        (f"/api/sessions/{created['id']}/resume", None),
        (f"/api/sessions/{created['id']}/cancel", None),
        (f"/api/sessions/{created['id']}/messages", {"content": "hi"}),
        (f"/api/sessions/{created['id']}/rollback", {"checkpoint_seq": 1}),
        (f"/api/sessions/{created['id']}/fork", {"checkpoint_seq": 1}),
        (f"/api/sessions/{created['id']}/approve", {}),
        (f"/api/sessions/{created['id']}/reject", {}),
    ]:
        response = call("post", path, role="viewer", body=body if body is not None else {})
        assert response.status_code == 403, path
        assert "operator role" in response.json()["detail"]
    assert AgentSession.objects.count() == 1


def test_outsider_cannot_even_read(call):
    created = start(call)
    assert call("get", "/api/sessions", role="outsider").status_code == 403
    assert call("get", f"/api/sessions/{created['id']}", role="outsider").status_code == 403
    assert call("get", f"/api/sessions/{created['id']}/steps", role="outsider").status_code == 403


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"agent": "nope", "input": "hi"}, 400, "unknown agent 'nope'"),
        ({"agent": "demo", "input": "   "}, 400, "input must not be empty"),
        ({"agent": "demo"}, 422, "input"),
        ({"agent": "demo", "input": 12}, 422, "input"),
        ({"agent": ["demo"], "input": "x"}, 422, "agent"),
    ],
)
def test_bad_start_input_is_a_clear_4xx_and_writes_nothing(call, body, status, needle):
    response = call("post", "/api/sessions", body=body)
    assert response.status_code == status, response.content
    assert needle in response.json()["detail"]
    assert AgentSession.objects.count() == 0 and Step.objects.count() == 0


def test_malformed_json_is_a_4xx(client, tokens):
    response = client.post(
        "/api/sessions",
        "{not json",
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {tokens['operator']}",
    )
    assert 400 <= response.status_code < 500
    assert AgentSession.objects.count() == 0


def test_missing_session_is_404(call):
    missing = uuid.uuid4()
    response = call("get", f"/api/sessions/{missing}")
    assert response.status_code == 404 and str(missing) in response.json()["detail"]
    assert call("post", f"/api/sessions/{missing}/resume", body={}).status_code == 404
    assert call("get", "/api/sessions/not-a-uuid").status_code == 422


def test_actions_that_do_not_fit_the_status_are_409(call):
    created = start(call, agent="echo", text="hi")
    run_inline(created["id"])
    sid = created["id"]
    response = call("post", f"/api/sessions/{sid}/resume", body={})
    assert response.status_code == 409 and "cannot be resumed" in response.json()["detail"]
    response = call("post", f"/api/sessions/{sid}/approve", body={})
    assert response.status_code == 409 and "nothing is waiting" in response.json()["detail"]
    response = call("post", f"/api/sessions/{sid}/rollback", body={"checkpoint_seq": 999})
    assert response.status_code == 404 and "no checkpoint at seq 999" in response.json()["detail"]
    events = AuditEvent.objects.filter(session_id=sid).values_list("action", flat=True)
    assert list(events) == ["start"]


def test_running_session_resume_is_already_running(call):
    created = start(call, agent="slow", text="count to 3")
    session_store().claim(created["id"], "w", ttl=60)
    response = call("post", f"/api/sessions/{created['id']}/resume", body={})
    assert response.status_code == 409
    assert response.json() == {"error": "already_running", "detail": "session is already running"}


def test_approve_and_reject_over_the_api(call):
    created = start(call, agent="approval", text="pay invoice 3")
    run_inline(created["id"])
    session = call("get", f"/api/sessions/{created['id']}").json()
    assert session["status"] == "waiting_input"
    assert session["pending_approval"]["tool"] == "send_payment"
    assert (
        call("post", f"/api/sessions/{created['id']}/messages", body={"content": "x"}).status_code
        == 409
    )
    response = call("post", f"/api/sessions/{created['id']}/reject", body={"reason": "not today"})
    assert response.status_code == 202
    run_inline(created["id"])
    session = call("get", f"/api/sessions/{created['id']}").json()
    assert session["final_answer"] == "Payment not sent: rejected by olivia: not today"


def test_rollback_then_fork(call):
    created = start(call)
    run_inline(created["id"])
    sid = created["id"]
    response = call("post", f"/api/sessions/{sid}/rollback", body={"checkpoint_seq": 7})
    assert response.status_code == 200 and response.json()["status"] == "paused"
    steps = call("get", f"/api/sessions/{sid}/steps?limit=200").json()["items"]
    assert [s["seq"] for s in steps if s["superseded"]] == list(range(8, 14))
    live = call("get", f"/api/sessions/{sid}/steps?limit=200&include_superseded=false").json()[
        "items"
    ]
    assert len(live) == 8

    response = call("post", f"/api/sessions/{sid}/fork", body={"checkpoint_seq": 7})
    assert response.status_code == 201
    forked = response.json()
    assert forked["parent"] == sid and forked["fork_seq"] == 7 and forked["status"] == "paused"
    assert forked["head"] == 7
    fork_steps = call("get", f"/api/sessions/{forked['id']}/steps").json()["items"]
    assert [s["seq"] for s in fork_steps] == list(range(1, 8))
    # The fork goes on by itself from its copied history.
    assert call("post", f"/api/sessions/{forked['id']}/resume", body={}).status_code == 202
    run_inline(forked["id"])
    assert call("get", f"/api/sessions/{forked['id']}").json()["status"] == "completed"


def test_list_is_keyset_paginated_and_filtered(call):
    ids = [start(call, agent="echo", text=f"hi {i}")["id"] for i in range(7)]
    seen, cursor = [], None
    while True:
        suffix = f"&cursor={cursor}" if cursor else ""
        page = call("get", f"/api/sessions?limit=3&agent=echo{suffix}", role="viewer").json()
        seen += [s["id"] for s in page["items"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids) and len(seen) == len(set(seen))
    assert call("get", "/api/sessions?status=queued").json()["items"]
    assert call("get", "/api/sessions?status=bogus").status_code == 400
    assert call("get", "/api/sessions?cursor=%%%").status_code == 400
    assert call("get", "/api/sessions?limit=0").status_code == 422


def test_openapi_document_lists_every_endpoint(client, users):
    client.force_login(users["viewer"])
    spec = client.get("/api/openapi.json").json()
    paths = spec["paths"]
    assert set(paths) >= {
        "/api/sessions",
        "/api/sessions/{session_id}",
        "/api/sessions/{session_id}/steps",
        "/api/sessions/{session_id}/messages",
        "/api/sessions/{session_id}/resume",
        "/api/sessions/{session_id}/cancel",
        "/api/sessions/{session_id}/rollback",
        "/api/sessions/{session_id}/fork",
        "/api/sessions/{session_id}/approve",
        "/api/sessions/{session_id}/reject",
    }


def test_create_api_token_command(users):
    import getpass
    from io import StringIO

    from django.core.management import call_command
    from django.core.management.base import CommandError

    out = StringIO()
    call_command("create_api_token", "olivia", stdout=out)
    raw = out.getvalue().strip()
    token = ApiToken.objects.get(key_hash=ApiToken.hash(raw))
    assert token.user == users["operator"]
    event = AuditEvent.objects.get(action="admin_issue_token")
    assert event.after["user"] == "olivia" and event.after["key_prefix"] == token.key_prefix
    assert event.request_meta == {
        "via": "cli",
        "command": "create_api_token",
        "os_user": getpass.getuser(),
    }
    assert raw not in str(event.after)  # the secret is kept nowhere
    with pytest.raises(CommandError, match="no user named 'nobody'"):
        call_command("create_api_token", "nobody")


def test_uncertain_call_over_the_api(call):
    from tests.sessions_app.test_dashboard import _uncertain_notify_session

    session = _uncertain_notify_session()
    data = call("get", f"/api/sessions/{session.id}").json()
    assert data["status"] == "waiting_input"
    assert data["uncertain_call"]["tool"] == "send_notification"
    assert data["uncertain_call"]["idempotency_key"] == f"{session.id}:4"
    bad = call("post", f"/api/sessions/{session.id}/uncertain", body={"resolution": "maybe"})
    assert bad.status_code == 400 and "resolution must be one of" in bad.json()["detail"]
    ok = call(
        "post",
        f"/api/sessions/{session.id}/uncertain",
        body={"resolution": "record_result", "output": {"message_id": "m-1"}},
    )
    assert ok.status_code == 202 and ok.json()["status"] == "queued"
    run_inline(session.id)
    assert (
        call("get", f"/api/sessions/{session.id}").json()["final_answer"]
        == "Notification sent: m-1."
    )


def test_detail_of_a_waiting_session_reads_its_head_checkpoint_once(
    call, django_assert_num_queries
):
    """The client's recent wrong credentials (the throttle), the token, its last use, the
    caller's roles, the session and its head checkpoint, and for an uncertain call the
    step that recorded it: nothing read twice."""
    from tests.sessions_app.test_dashboard import _uncertain_notify_session

    approval = start(call, agent="approval", text="pay invoice 3")
    run_inline(approval["id"])
    uncertain = _uncertain_notify_session()
    for session_id, queries, field in (
        (approval["id"], 6, "pending_approval"),
        (uncertain.id, 7, "uncertain_call"),
    ):
        with django_assert_num_queries(queries) as captured:
            response = call("get", f"/api/sessions/{session_id}", role="viewer")
        data = response.json()
        assert data["status"] == "waiting_input" and data[field] is not None
        checkpoint_reads = [
            q for q in captured.captured_queries if 'FROM "sessions_app_checkpoint"' in q["sql"]
        ]
        assert len(checkpoint_reads) == 1


def test_a_form_body_is_refused_naming_the_type_and_an_empty_one_is_no_body(call, client, tokens):
    created = start(call)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {tokens['operator']}"}
    form = client.post(
        f"/api/sessions/{created['id']}/messages",
        "content=hi",
        content_type="application/x-www-form-urlencoded",
        **auth,
    )
    assert form.status_code == 415
    assert form.json() == {
        "error": "unsupported_media_type",
        "detail": "request bodies are JSON, not application/x-www-form-urlencoded",
    }
    # A multipart body without its boundary: refused the same way, never a 500.
    broken = client.generic(
        "POST",
        "/api/imports",
        b"\x89PNG\r\n",
        content_type="multipart/form-data",
        **auth,
    )
    assert broken.status_code == 415
    # A bodiless POST that a client labelled as a form (urllib, many HTTP libraries) is
    # simply a POST without a body.
    cancel = client.post(
        f"/api/sessions/{created['id']}/cancel",
        b"",
        content_type="application/x-www-form-urlencoded",
        **auth,
    )
    assert cancel.status_code == 200, cancel.content
    assert cancel.json()["status"] == "cancelled"
