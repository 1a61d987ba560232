"""Frozen v1 sessions in the database: they load, read the same, upgrade, resume; and the
commands that upgrade them (upgrade_state) and gate a deploy on them (check_state_compat)."""

from __future__ import annotations

import html
import json
import re
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from agent_runtime.loop import build_messages
from agent_runtime.state import SCHEMA_VERSION, describe_step, step_text
from agent_runtime.upgraders import IncompatibleSchemaError, load_step_payload
from sessions_app.models import AgentSession, Checkpoint, Status, Step
from sessions_app.runtime import agent_registry
from sessions_app.selectors.core import incompatible_sessions
from sessions_app.services.core import (
    checkpoint_rollback,
    session_approve,
    session_fork,
    session_mark_incompatible,
    session_resume,
    session_send_message,
)
from sessions_app.store import session_store
from sessions_app.upkeep.state_upgrade import downgrade_blobs, upgrade_blobs
from sessions_app.workers.jobs import run_session_job
from tests.agent_runtime.test_upgraders import UPGRADES_FROM_V1, as_dicts
from tests.fixtures.loader import V1_SESSIONS, dump_blobs, dump_tables, insert_fixture, read_fixture

from ..conftest import compat_gate, run_session_inline

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _job_keeps_the_test_connection(monkeypatch):
    # The job closes stale connections first; inside a test's transaction it must not.
    monkeypatch.setattr("sessions_app.workers.jobs.close_old_connections", lambda: None)


DEMO_ANSWER = "(12*7)+3 = 87. Saved as note note-{id}-call_1_1."


def upgrade(*args: str) -> str:
    out = StringIO()
    call_command("upgrade_state", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def messages_of(session_id: str) -> list[dict]:
    # Only the columns every schema has: also called with the database migrated back.
    session = AgentSession.objects.only("id", "agent").get(id=session_id)
    agent = agent_registry().get(session.agent)
    return as_dicts(
        build_messages(agent.instructions, session_store().load_head(session_id).history)
    )


def page_texts(client, session_id: str) -> list[str]:
    response = client.get(reverse("sessions:detail", args=[session_id]))
    assert response.status_code == 200
    return [
        html.unescape(text)
        for text in re.findall(r'<pre class="text">(.*?)</pre>', response.content.decode(), re.S)
    ]


def conversation(session_id: str) -> list[tuple[str, dict]]:
    """Kinds and (current-version) payloads of the live trace, without system steps or ids."""
    out = []
    for step in Step.objects.filter(session_id=session_id, superseded_at__isnull=True).order_by(
        "seq"
    ):
        if step.kind == "system":
            continue
        payload = load_step_payload(step.kind, step.payload, step.schema_version).value
        out.append((step.kind, json.loads(json.dumps(payload).replace(session_id, "<session>"))))
    return out


def make_v99(session_id: str, *, step_seq: int | None = None) -> None:
    """What a newer release would have left behind: a blob in schema version 99."""
    session = AgentSession.objects.get(id=session_id)
    if step_seq is None:
        row = Checkpoint.objects.get(session=session, seq=session.head)
        row.state = {**row.state, "schema_version": 99, "new_in_v99": {"x": 1}}
        row.schema_version = 99
    else:
        row = Step.objects.get(session=session, seq=step_seq)
        row.payload = {"parts": ["from the future"]}
        row.schema_version = 99
    row.save()


@pytest.mark.parametrize("name", V1_SESSIONS)
def test_v1_session_shows_the_same_history_before_and_after_the_upgrade(name, client, users):
    client.force_login(users["viewer"])
    fixture = read_fixture(name)
    session_id = insert_fixture(name)
    live = [s for s in fixture["steps"] if s["superseded_at"] is None]

    head = session_store().load_head(session_id)
    assert head.step_versions == {1: len(live)}
    assert head.upgraders_applied == UPGRADES_FROM_V1 and head.checkpoint.schema_version == 1
    assert messages_of(session_id) == fixture["v1_messages"]
    trace = read_steps(session_id)
    assert all(error == "" for *_, error in trace)
    texts = page_texts(client, session_id)
    assert texts and texts[0] == fixture["steps"][0]["payload"]["text"]

    summary = upgrade()
    assert "refused 0" in summary

    assert set(
        Step.objects.filter(session_id=session_id).values_list("schema_version", flat=True)
    ) == {SCHEMA_VERSION}
    for checkpoint in Checkpoint.objects.filter(session_id=session_id):
        assert checkpoint.schema_version == checkpoint.state["schema_version"] == SCHEMA_VERSION
    head = session_store().load_head(session_id)
    assert head.step_versions == {SCHEMA_VERSION: len(live)} and head.upgraders_applied == ()
    assert messages_of(session_id) == fixture["v1_messages"]
    assert read_steps(session_id) == trace
    assert page_texts(client, session_id) == texts


def read_steps(session_id: str) -> list[tuple[int, str, str, str]]:
    """Every step in order (superseded ones too) as this code reads it: (seq, kind, its
    line of text, why it cannot be loaded or "")."""
    out = []
    for step in Step.objects.filter(session_id=session_id).order_by("seq"):
        try:
            payload = load_step_payload(step.kind, step.payload, step.schema_version).value
        except IncompatibleSchemaError as exc:
            out.append((step.seq, step.kind, "", str(exc)))
        else:
            out.append((step.seq, step.kind, describe_step(step.kind, payload), ""))
    return out


def head_session(session_id: str) -> AgentSession:
    return AgentSession.objects.get(id=session_id)


def test_the_trace_reads_like_a_trace():
    session_id = insert_fixture("failed")
    texts = [text for _, _, text, _ in read_steps(session_id)]
    assert texts[0] == "what is 7/0, then save it as a note"
    assert texts[1] == "run_started"
    assert texts[2] == (
        "Plan: compute 7/0; save the result as a note; answer. [calls update_plan, calculator]"
    )
    assert texts[5] == 'calculator({"expression": "7/0"})'
    assert texts[6] == "calculator: error: division by zero"
    assert texts[7].startswith("model: model call failed after 1 attempt(s): 401")


def test_mid_run_v1_session_resumed_after_the_upgrade_ends_like_an_uninterrupted_run():
    reference = insert_fixture("completed")
    session_id = insert_fixture("mid_run")
    upgrade()
    result = run_session_inline(session_id)
    assert result.outcome == "completed"
    session = head_session(session_id)
    assert session.status == Status.COMPLETED
    assert session.final_answer == DEMO_ANSWER.format(id=session_id)
    assert conversation(session_id) == conversation(reference)
    # The dangling save_note call ran again under its recorded key.
    assert Step.objects.get(session_id=session_id, seq=11).idempotency_key == f"{session_id}:11"
    # Everything the resumed run wrote is in the current version.
    new = Step.objects.filter(session_id=session_id, seq__gt=11)
    assert set(new.values_list("schema_version", flat=True)) == {SCHEMA_VERSION}


def test_v1_sessions_also_resume_without_the_upgrade():
    """Old blobs load through the upgraders whether or not upgrade_state ran."""
    session_id = insert_fixture("mid_run")
    assert run_session_inline(session_id).outcome == "completed"
    run_started = Step.objects.filter(session_id=session_id, payload__event="run_started")
    loaded = run_started.order_by("-seq").first().payload
    assert loaded["checkpoint_seq"] == 7 and loaded["schema_version"] == 1
    assert loaded["upgraders"] == list(UPGRADES_FROM_V1) and loaded["step_versions"] == {"1": 11}
    versions = dict(
        Step.objects.filter(session_id=session_id)
        .values_list("seq", "schema_version")
        .order_by("seq")
    )
    assert {versions[seq] for seq in range(1, 12)} == {1}  # history is not rewritten by runs
    assert {versions[seq] for seq in versions if seq > 11} == {SCHEMA_VERSION}


def test_waiting_v1_session_is_approved_and_completes():
    session_id = insert_fixture("waiting_approval")
    session_approve(session_id=session_id)
    assert run_session_inline(session_id).outcome == "completed"
    assert (
        head_session(session_id).final_answer
        == f"Payment sent: reference pay-{session_id}-call_0_0."
    )


def test_failed_v1_session_is_resumed_and_completes():
    session_id = insert_fixture("failed")
    session_resume(session_id=session_id)
    assert run_session_inline(session_id).outcome == "completed"
    assert head_session(session_id).final_answer == "I could not compute 7/0: division by zero"


def test_v1_session_is_rolled_back_and_resumed():
    session_id = insert_fixture("completed")
    checkpoint_rollback(session_id=session_id, checkpoint_seq=7)
    copy = Checkpoint.objects.get(session_id=session_id, reason="before-rollback")
    assert copy.schema_version == 1 and copy.state["schema_version"] == 1  # a copy, as stored
    session_resume(session_id=session_id)
    assert run_session_inline(session_id).outcome == "completed"
    assert head_session(session_id).final_answer == DEMO_ANSWER.format(id=session_id)


def test_a_v1_session_is_forked_through_the_upgraders_and_the_fork_completes():
    # The checkpoint's v1 blob has no final_answer where v3 has one, and a v1 batch
    # cursor; the fork reads it as a worker would.
    session_id = insert_fixture("completed")
    parent = head_session(session_id)
    fork = session_fork(session_id=session_id, checkpoint_seq=parent.head)
    assert fork.final_answer == parent.final_answer != ""
    assert fork.cost == parent.cost
    session_send_message(session_id=fork.id, content="what is 6*7?")
    assert run_session_inline(str(fork.id)).outcome == "completed"
    assert head_session(str(fork.id)).final_answer.startswith("6*7 = 42")


def test_upgrade_is_idempotent():
    for name in V1_SESSIONS:
        insert_fixture(name)
    first = upgrade()
    assert "checkpoints: read 6, upgraded 6, already current 0, refused 0" in first
    assert "steps:       read 36, upgraded 36, already current 0, refused 0" in first
    after_first = dump_tables()
    second = upgrade()
    assert dump_tables() == after_first
    assert "checkpoints: read 6, upgraded 0, already current 6, refused 0" in second
    assert "steps:       read 36, upgraded 0, already current 36, refused 0" in second


def test_dry_run_writes_nothing():
    for name in V1_SESSIONS:
        insert_fixture(name)
    marked = insert_fixture("completed", session_id="00000000-0000-4000-8000-000000000001")
    session_mark_incompatible(session_id=marked, reason="an old worker could not load it")
    before = dump_tables()
    out = upgrade("--dry-run", "--batch-size", "4")
    assert dump_tables() == before
    assert "checkpoints: read 9, would upgrade 9, already current 0, refused 0" in out
    assert "dry run: nothing was written" in out
    assert f"would clear the incompatible mark of 1 session(s) that load now: {marked}" in out


def test_upgrade_refuses_a_newer_blob_and_leaves_it_untouched():
    session_id = insert_fixture("mid_run")
    make_v99(session_id)
    v99 = Checkpoint.objects.filter(schema_version=99).values().get()
    out = upgrade("--batch-size", "3")
    assert "checkpoints: read 1, upgraded 0, already current 0, refused 1" in out
    assert "steps:       read 11, upgraded 11, already current 0, refused 0" in out
    assert (
        f"checkpoint seq 7 of session {session_id}: checkpoint state was written by schema " in out
    )
    assert Checkpoint.objects.filter(schema_version=99).values().get() == v99


def test_a_migration_to_an_older_version_leaves_newer_blobs_and_refuses_none():
    """Migration 0009 (to version 2) run on blobs `upgrade_state` already took to version 3:
    they are past its target, not beyond this code's reach; nothing to rewrite or refuse."""
    for name in V1_SESSIONS:
        insert_fixture(name)
    upgrade()
    before = dump_tables()
    summary = upgrade_blobs(Checkpoint, Step, target=2)
    assert (summary.upgraded, summary.refused) == (0, 0)
    assert dump_tables() == before


def test_reversing_a_migration_leaves_older_blobs_and_refuses_none():
    """Migration 0015 reversed (version 3 down to 2) on blobs still at version 1: older than
    what it rewrites, they stay; only blobs newer than 3 would stop it."""
    for name in V1_SESSIONS:
        insert_fixture(name)
    before = dump_tables()
    summary = downgrade_blobs(Checkpoint, Step, from_version=3)
    assert (summary.upgraded, summary.refused) == (0, 0)
    assert dump_tables() == before


def test_reversing_a_migration_refuses_a_newer_blob():
    make_v99(insert_fixture("mid_run"))
    summary = downgrade_blobs(Checkpoint, Step, from_version=3)
    assert summary.refused == 1
    assert Checkpoint.objects.filter(schema_version=99).count() == 1


def test_upgrade_progress_bar_goes_to_stderr():
    insert_fixture("completed")
    out, err = StringIO(), StringIO()
    call_command("upgrade_state", "--batch-size", "5", stdout=out, stderr=err)
    assert "steps       [" in err.getvalue() and "100% 13/13" in err.getvalue()
    assert "[" not in out.getvalue()


def test_upgrade_rejects_a_bad_batch_size():
    with pytest.raises(CommandError, match="--batch-size must be at least 1"):
        upgrade("--batch-size", "0")


def test_upgrade_clears_the_mark_of_a_session_that_loads_now():
    loads = insert_fixture("mid_run")
    still_broken = insert_fixture("waiting_approval")
    make_v99(still_broken)
    for session_id in (loads, still_broken):
        session_mark_incompatible(session_id=session_id, reason="could not load")
    out = upgrade()
    assert f"cleared the incompatible mark of 1 session(s) that load now: {loads}" in out
    assert [str(s.id) for s in incompatible_sessions()] == [still_broken]


def test_the_job_refuses_a_v99_session_marks_it_and_writes_nothing():
    session_id = insert_fixture("mid_run")
    make_v99(session_id)
    before = dump_blobs()
    assert run_session_job(session_id) == "incompatible"
    assert dump_blobs() == before  # no step, no checkpoint, no blob changed
    session = head_session(session_id)
    assert session.lease_owner is None and session.lease_expires_at is None
    assert session.last_seq == 11 and session.step_count == 11
    assert session.incompatible_reason.startswith(
        "checkpoint at seq 7: checkpoint state was written by schema version 99, newer than "
        f"this code understands (up to {SCHEMA_VERSION})"
    )
    assert session.incompatible_code_schema == SCHEMA_VERSION
    assert list(incompatible_sessions()) == [session]
    assert not session.is_stuck()


def test_a_state_not_of_its_versions_shape_is_refused_by_the_run_not_counted_as_a_crash():
    """A head checkpoint whose budgets say "ten" (written past every check, by SQL): the
    run names the field and writes nothing; no worker died, so nothing counts towards a
    poison session, however often it is tried."""
    session_id = insert_fixture("mid_run")
    upgrade()  # its blobs at this code's version: what the run reads is the state as stored
    checkpoint = Checkpoint.objects.get(session_id=session_id, seq=7)
    assert checkpoint.schema_version == SCHEMA_VERSION
    state = {**checkpoint.state, "budgets": {"max_steps": "ten"}}
    Checkpoint.objects.filter(pk=checkpoint.pk).update(state=state)
    before = dump_blobs()
    for _ in range(6):
        assert run_session_job(session_id) == "incompatible"
    assert dump_blobs() == before
    session = head_session(session_id)
    assert session.crash_count == 0 and session.lease_owner is None
    assert session.status != "failed"
    assert session.incompatible_reason.startswith("checkpoint at seq 7: ")
    assert "budgets.max_steps: expected an integer >= 1, got 'ten'" in session.incompatible_reason


def test_the_job_refuses_a_session_with_a_v99_step():
    session_id = insert_fixture("mid_run")
    make_v99(session_id, step_seq=8)
    before = dump_blobs()
    assert run_session_job(session_id) == "incompatible"
    assert dump_blobs() == before
    assert head_session(session_id).incompatible_reason.startswith(
        "step seq 8 (model): model step payload was written by schema version 99"
    )


def test_a_successful_run_or_a_resume_clears_the_mark():
    session_id = insert_fixture("mid_run")
    session_mark_incompatible(session_id=session_id, reason="an old worker could not load it")
    assert run_session_inline(session_id).outcome == "completed"
    assert not head_session(session_id).is_incompatible

    other = insert_fixture("failed")
    session_mark_incompatible(session_id=other, reason="an old worker could not load it")
    session_resume(session_id=other)
    assert not head_session(other).is_incompatible


def test_detail_and_list_show_an_incompatible_session(client, users):
    session_id = insert_fixture("mid_run")
    make_v99(session_id)
    run_session_job(session_id)
    client.force_login(users["viewer"])
    detail = client.get(reverse("sessions:detail", args=[session_id])).content.decode()
    assert "checkpoint at seq 7: checkpoint state was written by schema version 99" in detail
    assert 'class="badge incompatible"' in detail
    listing = client.get(reverse("sessions:list")).content.decode()
    assert 'class="badge incompatible"' in listing


def test_detail_shows_a_step_it_cannot_load_without_half_reading_it(client, users):
    session_id = insert_fixture("completed")
    make_v99(session_id, step_seq=3)
    client.force_login(users["viewer"])
    detail = client.get(reverse("sessions:detail", args=[session_id])).content.decode()
    assert "cannot be loaded: model step payload was written by schema version 99" in detail
    assert "from the future" in detail  # the stored payload is still shown as it is


def test_check_state_compat_passes_v1_sessions_and_counts_them():
    for name in V1_SESSIONS:
        insert_fixture(name)
    out, error = compat_gate()
    assert error is None
    assert "all 3 session(s) load with this code" in out  # completed ones are not checked
    assert "live sessions per schema version: v1: 3" in out
    upgrade()
    out, error = compat_gate("--all")
    assert error is None and f"live sessions per schema version: v{SCHEMA_VERSION}: 4" in out


def test_check_state_compat_names_each_session_that_would_fail():
    for name in V1_SESSIONS:
        insert_fixture(name)
    waiting = read_fixture("waiting_approval")["session"]["id"]
    mid_run = read_fixture("mid_run")["session"]["id"]
    make_v99(waiting)
    make_v99(mid_run, step_seq=9)
    out, error = compat_gate()
    assert error is not None and error.returncode == 1
    assert "2 of 3 session(s) would fail to load" in str(error)
    block = out[out.index(f"FAIL {waiting}") :]
    assert block.splitlines()[1:5] == [
        "  agent:  approval",
        "  status: waiting_input",
        "  failed: checkpoint at seq 4",
        "  error:  checkpoint state was written by schema version 99, newer than this code "
        f"understands (up to {SCHEMA_VERSION}); deploy the newer code or roll the data back",
    ]
    assert f"FAIL {mid_run}" in out and "  failed: step seq 9 (tool_call)" in out
    assert "live sessions per schema version: v1: 1, v99: 2" in out


def test_check_state_compat_json():
    session_id = insert_fixture("waiting_approval")
    make_v99(session_id)
    out, error = compat_gate("--json")
    assert error is not None
    report = json.loads(out)
    assert report["checked"] == 1 and report["sessions_per_version"] == {"99": 1}
    assert report["failures"][0]["session"] == session_id
    assert report["failures"][0]["where"] == "checkpoint at seq 4"


def test_writers_emit_only_the_current_version():
    from sessions_app.services.core import session_start

    session = session_start(agent="demo", input="what is (12*7)+3, then save it as a note")
    run_session_inline(str(session.id))
    assert set(Step.objects.values_list("schema_version", flat=True)) == {SCHEMA_VERSION}
    assert {c.state["schema_version"] for c in Checkpoint.objects.all()} == {SCHEMA_VERSION}
    model = Step.objects.filter(kind="model").order_by("seq").last()
    assert step_text(model.payload) == DEMO_ANSWER.format(id=session.id)
    for step in Step.objects.all():
        load_step_payload(step.kind, step.payload, step.schema_version)  # loads as stored


def test_the_previous_release_still_writes_sessions_after_migrate():
    """Between `migrate` and the restart (and after a rollback of the code), v1 processes
    insert sessions and steps knowing only the v1 columns; the new code runs them."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    v1 = MigrationExecutor(connection).loader.project_state(
        ("sessions_app", "0007_audit_append_only")
    )
    old_session = v1.apps.get_model("sessions_app", "AgentSession")
    old_step = v1.apps.get_model("sessions_app", "Step")
    session = old_session.objects.create(agent="echo", last_seq=1, step_count=1)
    old_step.objects.create(session=session, seq=1, kind="user", payload={"text": "hi"})
    stored = Step.objects.get(session_id=session.id)
    assert stored.schema_version == 1  # v1's column default, as the old code writes it
    assert head_session(session.id).incompatible_reason == ""
    assert run_session_inline(str(session.id)).outcome == "completed"
    assert head_session(session.id).final_answer == "You said: hi"
