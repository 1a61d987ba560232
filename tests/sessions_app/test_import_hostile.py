"""An import is untrusted input: a file crafted to hold what the database or the pages
cannot (times past the years 1 to 9999 in UTC, integers past their column, costs of NaN or
1e30, nesting 1,000 deep, a maximal fencing token, a decompression bomb, forged audit
history, a secret as an idempotency key) is refused with an error naming the field, or
imported in a form every page reads back; nothing it writes takes a page down."""

from __future__ import annotations

import gzip
import hashlib
import json
import zlib
from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from sessions_app.models import (
    AgentSession,
    ApiToken,
    AuditEvent,
    Checkpoint,
    ImportedAuditRecord,
    Step,
)
from sessions_app.services.core import session_resume, session_start
from sessions_app.upkeep import transfer
from sessions_app.upkeep.transfer import TransferError, export_bytes, import_session

from ..conftest import run_inline

pytestmark = pytest.mark.django_db(transaction=True)

Records = list[dict]


DEEP = "@deep@"  # a value `signed` writes as an array nested 1,000 deep


def signed(records: Records) -> bytes:
    """The records as an export file whose digest and counts match (a crafted file, not a
    damaged one). json.dumps writes NaN and Infinity as JSON's forbidden literals."""
    body = [
        json.dumps(r, sort_keys=True, separators=(",", ":")).replace(
            json.dumps(DEEP), "[" * 1000 + "]" * 1000
        )
        + "\n"
        for r in records[:-1]
    ]
    counts = {kind: sum(r["kind"] == kind for r in records) for kind in ("step", "checkpoint")}
    counts["audit"] = sum(r["kind"] == "audit" for r in records)
    end = {"kind": "end", "counts": counts, "sha256": hashlib.sha256("".join(body).encode())}
    end["sha256"] = end["sha256"].hexdigest()
    return gzip.compress(("".join(body) + json.dumps(end) + "\n").encode())


def records_of(data: bytes) -> Records:
    return [json.loads(line) for line in gzip.decompress(data).splitlines()]


@pytest.fixture
def exported() -> Records:
    session = run_inline(session_start(agent="demo", input="what is (12*7)+3, then save it"))
    return records_of(export_bytes(session))


def change(kind: str, **values) -> Callable[[Records], Records]:
    """Set `values` in the first record of `kind`'s data."""

    def spoil(records: Records) -> Records:
        out, done = [], False
        for r in records:
            if r["kind"] == kind and not done:
                r, done = {**r, "data": {**r["data"], **values}}, True
            out.append(r)
        return out

    return spoil


def nested(depth: int) -> object:
    value: object = "bottom"
    for _ in range(depth):
        value = [value]
    return value


def with_audit(**data) -> Callable[[Records], Records]:
    record = {
        "kind": "audit",
        "data": {
            "action": "approve",
            "actor_label": "admin",
            "after": {},
            "before": {},
            "created_at": "2025-01-01T00:00:00+00:00",
            "request_meta": {"via": "dashboard"},
            **data,
        },
    }
    return lambda records: [*records[:-1], record, records[-1]]


HOSTILE = [
    (change("session", created_at="9999-12-31T23:59:59-05:00"), "session created_at"),
    (change("session", updated_at="0001-01-01T00:00:00+05:00"), "session updated_at"),
    (change("step", started_at="9999-12-31T23:59:59-05:00"), "step 1 started_at"),
    (change("checkpoint", created_at="0001-01-01T00:00:00+05:00"), "checkpoint 1 created_at"),
    (with_audit(created_at="9999-12-31T23:59:59-05:00"), "audit record 2 created_at"),
    (change("session", tokens_in=2**63), "session tokens_in: 9223372036854775808 is outside"),
    (
        change("session", tokens_out=2**63 - 1),
        r"session tokens_out: 9223372036854775807 is outside -4611686018427387904 to "
        r"4611686018427387903 \(half",
    ),
    (change("session", step_count=2**31), "session step_count: 2147483648 is outside"),
    (
        change("session", last_seq=2**31 - 1),
        "session last_seq: 2147483647 is outside 0 to 1073741823",
    ),
    (change("step", tokens_out=-1), "step 1 tokens_out: -1 is outside"),
    (change("session", cost=float("nan")), "NaN is not a number JSON allows"),
    (change("session", cost=float("inf")), "Infinity is not a number JSON allows"),
    (change("session", cost="NaN"), "session cost: 'NaN' is not an amount"),
    (change("session", cost="Infinity"), "session cost: 'Infinity' is not an amount"),
    (change("session", cost=1e30), "session cost: 1e\\+30 is not an amount"),
    (change("session", cost="-5"), "session cost: '-5' is not an amount"),
    (change("session", cost="999999.9999999"), "session cost: '999999.9999999' is not an amount"),
    (change("session", parent="../etc"), "session parent: not a session id: '../etc'"),
    (change("session", created_by=["root"]), r"session created_by: not a username: \['root'\]"),
    (change("session", legal_hold="yes"), "session legal_hold: not true or false"),
    (change("step", payload=DEEP), "line 3 nests deeper than 100 levels"),
    (change("checkpoint", state=nested(150)), "nests deeper than 100 levels"),
    (
        change("step", payload={"content": [{"text": "a\x00b"}]}),
        r"line 3 \(data.payload.content.0.text\): contains a NUL character",
    ),
    (change("session", title="\ud800"), r"line 2 \(data.title\): contains a lone surrogate"),
    (
        change("step", idempotency_key="ghp_" + "Zq7" * 12),
        "step 1 idempotency_key: not a key Respawn makes",
    ),
]


@pytest.mark.parametrize("spoil, message", HOSTILE, ids=[m[:40] for _, m in HOSTILE])
def test_a_crafted_file_is_refused_naming_the_field_and_writes_nothing(exported, spoil, message):
    before = [m.objects.count() for m in (AgentSession, Step, Checkpoint, ImportedAuditRecord)]
    with pytest.raises(TransferError, match=message):
        import_session(signed(spoil(exported)), new_ids=True)
    after = [m.objects.count() for m in (AgentSession, Step, Checkpoint, ImportedAuditRecord)]
    assert after == before


def test_every_import_path_refuses_naming_the_field(exported, client, users, tmp_path):
    data = signed(change("session", created_at="9999-12-31T23:59:59-05:00")(exported))
    target = tmp_path / "crafted.jsonl.gz"
    target.write_bytes(data)
    with pytest.raises(CommandError, match="crafted.jsonl.gz: session created_at: '9999-12-31"):
        call_command("import_session", str(target), "--new-ids")
    token = ApiToken.issue(users["operator"])[1]
    response = client.post(
        "/api/imports?new_ids=true",
        data,
        content_type="application/gzip",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.status_code == 400
    assert response.json()["error"] == "bad_export"
    assert "session created_at" in response.json()["detail"]
    client.force_login(users["operator"])
    upload = _upload(data)
    response = client.post(reverse("sessions:import"), {"file": upload, "new_ids": "1"})
    assert response.status_code == 400 and b"session created_at" in response.content


def _upload(data: bytes):
    import io

    upload = io.BytesIO(data)
    upload.name = "s.jsonl.gz"
    return upload


def test_a_maximal_imported_fencing_token_is_replaced_by_a_fresh_one():
    queued = records_of(export_bytes(session_start(agent="echo", input="hello")))
    spoiled = change("session", fencing_token=2**63 - 1, crash_count=32767, crash_seq=2**31 - 1)
    imported = import_session(signed(spoiled(queued)), new_ids=True).session
    assert (imported.fencing_token, imported.crash_count, imported.crash_seq) == (0, 0, -1)
    session_resume(session_id=imported.id)
    run_inline(imported)  # a worker takes the lease: token 1, no overflow
    imported.refresh_from_db()
    assert imported.fencing_token >= 1


def bomb(members: int) -> bytes:
    """`members` gzip members of 64 MB of zeros each: ~65 KB apiece."""
    inflater = zlib.compressobj(9, zlib.DEFLATED, 31)
    member = inflater.compress(b"\0" * 64 * 2**20) + inflater.flush()
    return member * members


def peak_kb() -> int:
    """The process's peak resident memory (VmHWM), in KB."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


def test_a_decompression_bomb_is_refused_before_memory_grows(settings):
    data = bomb(4)  # ~260 KB that unpack to 256 MB
    assert len(data) < 300_000
    settings.RESPAWN_IMPORT_MAX_BYTES = 2**30  # not the size limit: the ratio refuses it
    # Reset the peak to the present (Linux): an earlier test's peak cannot hide growth.
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    before = peak_kb()
    with pytest.raises(TransferError) as refused:
        import_session(data)
    grown = peak_kb() - before
    assert grown < 8 * 1024, f"the process's peak memory grew by {grown} KB"
    assert "unpacks to more than 100 times its compressed size" in str(refused.value)


def test_unpacking_in_pieces_gives_back_every_byte_of_every_member():
    text = b"".join(b"%d %x\n" % (i, i * 7919) for i in range(400_000))  # ~6 MB, ~4:1
    assert len(text) > 20 * 256 * 1024
    whole = gzip.compress(text[:1000]) + gzip.compress(text[1000:]) + gzip.compress(b"")
    assert transfer._decompress(whole) == text
    for cut in (10, len(whole) // 2, len(whole) - 1):
        with pytest.raises(TransferError, match="not a complete gzip file"):
            transfer._decompress(whole[:cut])
    with pytest.raises(TransferError, match="not a complete gzip file"):
        transfer._decompress(whole + b"trailing")


def test_a_file_that_unpacks_past_the_size_limit_is_refused(exported, settings):
    data = signed(exported)
    settings.RESPAWN_IMPORT_MAX_BYTES = len(gzip.decompress(data)) - 1
    with pytest.raises(TransferError, match=r"unpacks to more than 0 MB \(RESPAWN_IMPORT_MAX"):
        import_session(data, new_ids=True)
    settings.RESPAWN_IMPORT_MAX_BYTES = len(gzip.decompress(data))
    assert import_session(data, new_ids=True).steps


def test_imported_audit_history_is_kept_apart_and_labelled_with_its_origin(exported, client, users):
    forged = with_audit(action="approve", actor_label="admin", after={"note": "wire $1M"})
    made_up = with_audit(action="launch_missiles", actor_label="root")
    imported = import_session(signed(made_up(forged(exported))), new_ids=True).session
    # This deployment's audit trail holds its own records only: the import itself.
    assert list(AuditEvent.objects.filter(session=imported).values_list("action", flat=True)) == [
        "import"
    ]
    history = list(ImportedAuditRecord.objects.filter(session=imported))
    assert [(r.actor_label, r.action) for r in history][-2:] == [
        ("admin", "approve"),
        ("root", "launch_missiles"),
    ]
    old_id = exported[0]["session_id"]
    assert all(old_id in r.origin for r in history)
    client.force_login(users["operator"])
    audit_page = client.get(reverse("audit")).content.decode()
    assert "launch_missiles" not in audit_page and "wire $1M" not in audit_page
    page = client.get(reverse("sessions:detail", args=[imported.id])).content.decode()
    assert "Imported history" in page and "launch_missiles" in page and old_id in page
    # Exported again, the history stays marked as imported: another import keeps it apart.
    again = import_session(export_bytes(imported), new_ids=True).session
    assert AuditEvent.objects.filter(session=again).count() == 1
    assert ImportedAuditRecord.objects.filter(session=again, action="launch_missiles").get().origin


# The edges of what an import accepts: a file at every bound, read back by every page.
ACCEPTED = [
    change("session", created_at="0001-01-02T00:00:00+00:00", updated_at="9999-12-30T00:00:00Z"),
    change("step", started_at="9999-12-30T00:00:00+00:00", finished_at="0001-01-02T00:00:00Z"),
    change("checkpoint", created_at="9999-12-30T00:00:00+00:00"),
    change("session", tokens_in=2**62 - 1, tokens_out=2**62 - 1, step_count=2**30 - 1),
    change("session", cost="999999.999999"),
    change("step", tokens_in=2**30 - 1),
    lambda records: [
        {**r, "data": {**r["data"], "payload": {**r["data"]["payload"], "arguments": nested(90)}}}
        if r["kind"] == "step" and r["data"]["kind"] == "tool_call"
        else r
        for r in records
    ],
    change("session", title="<script>alert(1)</script> \u202e RTL", final_answer="é" * 10_000),
    with_audit(action="x" * 50, actor_label="<b>admin</b>", created_at="0001-01-02T00:00:00Z"),
    with_audit(before={"deep": nested(90)}, created_at="9999-12-30T00:00:00Z"),
]


def test_every_page_reads_back_whatever_an_import_accepted(exported, client, users):
    ids = [import_session(signed(spoil(exported)), new_ids=True).session.id for spoil in ACCEPTED]
    admin = User.objects.create_superuser("root", password="pw-root")
    token = ApiToken.issue(users["viewer"])[1]
    pages = [
        "/sessions/",
        "/sessions/?sort=created",
        "/sessions/?sort=-cost",
        reverse("sessions:charts"),
        reverse("sessions:attention"),
        reverse("audit"),
        reverse("sessions:costs"),
        "/admin/sessions_app/agentsession/",
        "/admin/sessions_app/step/",
        "/admin/sessions_app/auditevent/",
    ]
    for session_id in ids:
        pages += [
            reverse("sessions:detail", args=[session_id]),
            f"/admin/sessions_app/agentsession/{session_id}/change/",
            f"/admin/sessions_app/agentsession/{session_id}/delete/",
        ]
    for user in (users["viewer"], admin):
        client.force_login(user)
        for page in pages:
            if page.startswith("/admin/") and user is not admin:
                continue
            response = client.get(page)
            assert response.status_code < 500, (page, response.status_code)
    api = client.get("/api/sessions", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert api.status_code == 200
    assert {str(i) for i in ids} <= {s["id"] for s in api.json()["items"]}
    for session_id in ids:
        one = client.get(f"/api/sessions/{session_id}", HTTP_AUTHORIZATION=f"Bearer {token}")
        assert one.status_code == 200, one.content
