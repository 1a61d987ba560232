"""Sessions that travel: export, then import into this or another Respawn, byte for byte;
old versions through the upgraders; a bad file refused whole; who may do what."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import uuid
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from agent_runtime.providers import ProviderError
from agent_runtime.state import SCHEMA_VERSION
from sessions_app.models import AgentSession, ApiToken, AuditEvent, Checkpoint, Status, Step
from sessions_app.services.core import (
    checkpoint_rollback,
    session_cancel,
    session_fork,
    session_start,
)
from sessions_app.upkeep.transfer import TransferError, export_bytes, import_session
from tests.fixtures.loader import insert_fixture, read_fixture

from ..conftest import run_inline
from .test_state_upgrade import messages_of

pytestmark = pytest.mark.django_db(transaction=True)


def lines_of(data: bytes) -> list[dict]:
    return [json.loads(line) for line in gzip.decompress(data).splitlines()]


def comparable(data: bytes, session_id: str) -> list[dict]:
    """The records of an export without what differs between two exports of the same
    session: its id, the time of the export, the digest over them, and the exporting
    deployment's dispatch of it (an import never brings a lease or a job along)."""
    out = []
    for record in lines_of(data):
        record = json.loads(json.dumps(record).replace(session_id, "<session>"))
        if record["kind"] == "respawn-export":
            record.pop("exported_at")
        if record["kind"] == "session":
            # The exporting deployment's dispatch and lease state: never imported.
            for column in (
                *("lease_owner", "lease_expires_at", "job_id", "dispatched_at"),
                *("fencing_token", "crash_count", "crash_seq"),
            ):
                record["data"].pop(column)
        if record["kind"] == "end":
            record.pop("sha256")
            record["counts"].pop("audit")
        if record["kind"] != "audit":
            out.append(record)
    return out


def audit_records(data: bytes) -> list[tuple[str, str]]:
    return [
        (r["data"]["action"], r["data"]["actor_label"])
        for r in lines_of(data)
        if r["kind"] == "audit"
    ]


def revoked_key(spec, options):
    class Revoked:
        def complete(self, messages, tools, settings):
            raise ProviderError("401 Unauthorized: the API key was revoked", permanent=True)

    return Revoked(), spec


@pytest.fixture
def every_kind(settings):
    """Sessions of every kind and status: answered, waiting for approval, failed, rolled
    back (superseded steps, a before-rollback checkpoint), forked, cancelled, batch work
    with a cursor, and a team's agent with state of its own."""
    settings.RESPAWN_AGENTS = ["demo_agents:agents", "acme_agents:agents_v1"]
    completed = run_inline(session_start(agent="demo", input="what is (12*7)+3, then save it"))
    waiting = run_inline(session_start(agent="approval", input="pay invoice INV-9 to ACME"))
    failed = session_start(agent="demo", input="what is 7/0")

    run_inline(failed, make_provider=revoked_key)
    rolled = run_inline(session_start(agent="demo", input="what is (1+2)*3, then save it"))
    checkpoint_rollback(session_id=rolled.id, checkpoint_seq=7)
    fork = session_fork(session_id=completed.id, checkpoint_seq=7)
    cancelled = session_start(agent="echo", input="never mind")
    session_cancel(session_id=cancelled.id)
    batch = run_inline(session_start(agent="migrate", input="migrate 20 records in batches of 5"))
    acme = run_inline(session_start(agent="acme", input="open ticket printer on fire"))
    sessions = [completed, waiting, failed, rolled, fork, cancelled, batch, acme]
    for s in sessions:
        s.refresh_from_db()
    assert {s.status for s in sessions} >= {
        Status.COMPLETED,
        Status.WAITING_INPUT,
        Status.FAILED,
        Status.PAUSED,
        Status.CANCELLED,
    }
    assert Step.objects.filter(session=rolled, superseded_at__isnull=False).exists()
    return sessions


def test_every_kind_of_session_round_trips_byte_for_byte(every_kind):
    for session in every_kind:
        original = export_bytes(session)
        imported = import_session(original, new_ids=True)
        new_id = str(imported.session.id)
        assert new_id != str(session.id)
        again = export_bytes(imported.session)
        assert comparable(again, new_id) == comparable(original, str(session.id)), session.agent
        # The audit trail travels, and the import itself is on it.
        assert audit_records(again)[: len(audit_records(original))] == audit_records(original)
        assert audit_records(again)[len(audit_records(original))] == ("import", "system")


def test_the_same_session_exports_to_the_same_bytes_but_for_its_time_and_audit(every_kind):
    session = every_kind[0]
    first, second = export_bytes(session), export_bytes(session)
    assert comparable(first, str(session.id)) == comparable(second, str(session.id))
    assert audit_records(second)[-1] == ("export", "system")


def test_an_imported_session_runs_on_in_its_new_home(every_kind):
    waiting = every_kind[1]
    imported = import_session(export_bytes(waiting), new_ids=True).session
    assert imported.status == Status.WAITING_INPUT
    from sessions_app.services.core import session_approve

    session_approve(session_id=imported.id)
    run_inline(imported)
    assert imported.final_answer == f"Payment sent: reference pay-{imported.id}-call_0_0."


def test_an_import_keeps_its_id_and_refuses_one_that_exists(every_kind):
    session = every_kind[0]
    data = export_bytes(session)
    with pytest.raises(TransferError, match="exists already; import with new ids"):
        import_session(data)
    Step.objects.filter(session=session).delete()
    Checkpoint.objects.filter(session=session).delete()
    AgentSession.objects.filter(id=session.id).delete()
    assert import_session(data).session.id == session.id


def test_a_running_session_arrives_paused_with_no_lease():
    session = session_start(agent="slow", input="count to 3")
    AgentSession.objects.filter(id=session.id).update(
        status=Status.RUNNING, lease_owner="w1:1:abc", job_id="run-1", fencing_token=4
    )
    session.refresh_from_db()
    imported = import_session(export_bytes(session), new_ids=True).session
    assert imported.status == Status.PAUSED
    assert (imported.lease_owner, imported.job_id, imported.lease_expires_at) == (None, "", None)
    assert imported.fencing_token == 0  # this deployment's own fence, from the start


def test_a_v1_export_imports_through_the_upgraders_and_resumes():
    session_id = insert_fixture("mid_run")
    data = export_bytes(AgentSession.objects.get(id=session_id))
    assert {r["data"]["schema_version"] for r in lines_of(data) if r["kind"] == "step"} == {1}
    imported = import_session(data, new_ids=True)
    new_id = str(imported.session.id)
    assert imported.upgraded == 11 + 1  # every step and the checkpoint
    assert set(Step.objects.filter(session_id=new_id).values_list("schema_version", flat=True)) == {
        SCHEMA_VERSION
    }
    old = read_fixture("mid_run")
    expected = json.loads(json.dumps(old["v1_messages"]).replace(old["session"]["id"], new_id))
    assert messages_of(new_id) == expected
    from sessions_app.services.core import session_resume

    session_resume(session_id=new_id)
    finished = run_inline(imported.session)
    assert finished.status == Status.COMPLETED
    assert finished.final_answer == f"(12*7)+3 = 87. Saved as note note-{new_id}-call_1_1."


def _rezip(records: list[dict], *, fix_digest: bool) -> bytes:
    lines = [json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in records]
    if fix_digest:
        digest = hashlib.sha256("".join(lines[:-1]).encode()).hexdigest()
        end = {**records[-1], "sha256": digest}
        lines[-1] = json.dumps(end, sort_keys=True, separators=(",", ":")) + "\n"
    return gzip.compress("".join(lines).encode())


def _tables() -> tuple[int, int, int, int]:
    return (
        AgentSession.objects.count(),
        Step.objects.count(),
        Checkpoint.objects.count(),
        AuditEvent.objects.count(),
    )


@pytest.mark.parametrize(
    "spoil, message",
    [
        (lambda data, records: data[: len(data) // 2], "not a complete gzip file"),
        (lambda data, records: b"not gzip at all", "not a complete gzip file"),
        (
            lambda data, records: _rezip(records[:-3] + records[-1:], fix_digest=False),
            "does not match its contents",
        ),
        (
            lambda data, records: _rezip(records[:-1], fix_digest=False),
            "ends before its last line: it is truncated",
        ),
        (
            lambda data, records: _rezip(
                [
                    r
                    if r["kind"] != "step" or r["data"]["seq"] != 3
                    else {**r, "data": {**r["data"], "payload": {"changed": True}}}
                    for r in records
                ],
                fix_digest=False,
            ),
            "does not match its contents: it was changed",
        ),
        (
            lambda data, records: _rezip(
                [
                    r
                    if r["kind"] != "checkpoint"
                    else {
                        **r,
                        "data": {
                            **r["data"],
                            "state": {**r["data"]["state"], "schema_version": 99},
                        },
                    }
                    for r in records
                ],
                fix_digest=True,
            ),
            "newer than this code understands",
        ),
        (
            # A state of the right version but not its shape: a page or a run would meet it.
            lambda data, records: _rezip(
                [
                    r
                    if r["kind"] != "checkpoint"
                    else {
                        **r,
                        "data": {
                            **r["data"],
                            "state": {
                                **r["data"]["state"],
                                "budgets": {"max_steps": "ten"},
                            },
                        },
                    }
                    for r in records
                ],
                fix_digest=True,
            ),
            "budgets.max_steps: expected an integer >= 1, got 'ten'",
        ),
        (
            lambda data, records: _rezip([records[0], *records[2:]], fix_digest=True),
            "exactly one session, right after the header",
        ),
    ],
)
def test_a_bad_file_is_refused_whole_and_writes_nothing(spoil, message):
    session = run_inline(session_start(agent="demo", input="what is (12*7)+3, then save it"))
    data = export_bytes(session)
    before = _tables()
    with pytest.raises(TransferError, match=message):
        import_session(spoil(data, lines_of(data)), new_ids=True)
    assert _tables() == before


def test_a_step_that_fails_half_way_through_the_write_leaves_nothing(monkeypatch):
    session = run_inline(session_start(agent="demo", input="what is (12*7)+3, then save it"))
    data = export_bytes(session)
    before = _tables()

    def dies(*args, **kwargs):
        raise RuntimeError("the database went away mid-import")

    monkeypatch.setattr(Checkpoint.objects, "bulk_create", dies)
    with pytest.raises(RuntimeError):
        import_session(data, new_ids=True)
    assert _tables() == before


def test_the_commands_export_and_import(tmp_path: Path):
    session = run_inline(session_start(agent="demo", input="what is (12*7)+3, then save it"))
    target = tmp_path / "s.jsonl.gz"
    err = io.StringIO()
    call_command("export_session", str(session.id), "-o", str(target), stderr=err)
    assert f"exported {session.id}: 13 steps, 3 checkpoints, 1 audit records" in err.getvalue()
    out = io.StringIO()
    call_command("import_session", str(target), "--new-ids", stdout=out, stderr=io.StringIO())
    new_id = out.getvalue().strip()
    assert AgentSession.objects.get(id=new_id).final_answer.startswith("(12*7)+3 = 87")
    with pytest.raises(CommandError, match="no session with id nope"):
        call_command("export_session", "nope", "-o", str(target))
    target.write_bytes(b"\x1f\x8b broken")
    with pytest.raises(CommandError, match="s.jsonl.gz: not a complete gzip file"):
        call_command("import_session", str(target))


def test_a_viewer_exports_and_only_an_operator_imports(client, users):
    session = run_inline(session_start(agent="demo", input="what is (12*7)+3, then save it"))
    client.force_login(users["viewer"])
    assert client.get(reverse("sessions:export", args=[session.id])).status_code == 405
    assert not AuditEvent.objects.filter(action="export").exists()  # a GET writes nothing
    response = client.post(reverse("sessions:export", args=[session.id]))
    assert response.status_code == 200 and response["Content-Type"] == "application/gzip"
    data = response.content
    assert lines_of(data)[1]["data"]["id"] == str(session.id)
    upload = io.BytesIO(data)
    upload.name = "s.jsonl.gz"
    assert client.post(reverse("sessions:import"), {"file": upload}).status_code == 403
    client.force_login(users["outsider"])
    assert client.post(reverse("sessions:export", args=[session.id])).status_code == 403

    client.force_login(users["operator"])
    upload.seek(0)
    response = client.post(reverse("sessions:import"), {"file": upload, "new_ids": "1"})
    assert response.status_code == 302
    new_id = response["Location"].rstrip("/").rsplit("/", 1)[-1]
    assert uuid.UUID(new_id) != session.id
    bad = io.BytesIO(data[:40])
    bad.name = "bad.jsonl.gz"
    response = client.post(reverse("sessions:import"), {"file": bad})
    assert response.status_code == 400 and b"not a complete gzip file" in response.content
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {"export", "import"} <= actions


def test_the_api_exports_and_imports(client, users):
    session = run_inline(session_start(agent="demo", input="what is (12*7)+3, then save it"))
    viewer = {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(users['viewer'])[1]}"}
    operator = {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(users['operator'])[1]}"}
    assert client.get(f"/api/sessions/{session.id}/export", **viewer).status_code == 405
    reply = client.post(
        f"/api/sessions/{session.id}/export", content_type="application/json", **viewer
    )
    assert reply.status_code == 200, reply.content
    data = reply.content
    assert lines_of(data)[0]["kind"] == "respawn-export"
    refused = client.post("/api/imports", data, content_type="application/gzip", **viewer)
    assert refused.status_code == 403
    conflict = client.post("/api/imports", data, content_type="application/gzip", **operator)
    assert conflict.status_code == 409 and conflict.json()["error"] == "exists"
    created = client.post(
        "/api/imports?new_ids=true", data, content_type="application/gzip", **operator
    )
    assert created.status_code == 201, created.content
    assert created.json()["final_answer"].startswith("(12*7)+3 = 87")
    junk = client.post("/api/imports", b"junk", content_type="application/gzip", **operator)
    assert junk.status_code == 400 and junk.json()["error"] == "bad_export"
