"""Retention: policies that cap storage, proven by a dry run, archived first, never
touching a held session or the audit log, and safe to kill and run again."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError
from django.urls import reverse
from django.utils import timezone

from sessions_app.models import AgentSession, ApiToken, AuditEvent, Checkpoint, Status, Step
from sessions_app.services.core import (
    checkpoint_rollback,
    session_resume,
    session_set_legal_hold,
    session_start,
)
from sessions_app.store import session_store
from sessions_app.upkeep.retention import PolicyError, apply_retention, parse_policy
from sessions_app.upkeep.transfer import import_session

from ..conftest import ROOT, run_inline, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

DAY = timedelta(days=1)


def aged(session: AgentSession, days: float) -> AgentSession:
    AgentSession.objects.filter(id=session.id).update(updated_at=timezone.now() - days * DAY)
    session.refresh_from_db()
    return session


def finished(agent: str = "echo", text: str = "hello", days: float = 0) -> AgentSession:
    return aged(run_inline(session_start(agent=agent, input=text)), days)


@pytest.mark.parametrize(
    "raw, message",
    [
        ([], "must be a JSON object"),
        ({"keep": 1}, "unknown retention keys: keep"),
        ({"rules": [{"statuses": ["done"]}]}, "rules[0].statuses: unknown status 'done'"),
        (
            {"rules": [{"statuses": ["running"], "delete_after_days": 1}]},
            "delete_after_days applies to finished sessions only",
        ),
        ({"default": {"delete_after_days": -1}}, "default.delete_after_days must be a number >= 0"),
        ({"default": {"checkpoints": {"keep": 2}}}, "default.checkpoints must be an object"),
        (
            {"default": {"checkpoints": {"keep_last": 1.5}}},
            "keep_last must be a whole number",
        ),
        ({"rules": [{"agents": "support"}]}, "rules[0].agents must be a list"),
    ],
)
def test_a_policy_that_cannot_apply_names_its_problem(raw, message):
    with pytest.raises(PolicyError) as raised:
        parse_policy(raw)
    assert message in str(raised.value)


def test_a_bad_configured_policy_stops_every_command(settings):
    settings.RESPAWN_RETENTION = {"rules": [{"statuses": ["nope"]}]}
    with pytest.raises(SystemCheckError, match=r"respawn.E020.*unknown status 'nope'"):
        call_command("check")


POLICY = {
    "default": {"delete_after_days": 30},
    "rules": [{"agents": ["demo"], "statuses": ["failed"], "delete_after_days": 365}],
}


def test_finished_sessions_past_their_time_go_and_the_rest_stay(settings, tmp_path):
    old = finished(days=40)
    recent = finished(days=5)
    held = finished(days=40)
    session_set_legal_hold(session_id=held.id, hold=True, note="case 42")
    live = aged(session_start(agent="echo", input="not yet run"), 40)  # queued, never deleted
    kept_failed = aged(session_start(agent="demo", input="what is 7/0"), 40)
    AgentSession.objects.filter(id=kept_failed.id).update(status=Status.FAILED)
    audit_before = AuditEvent.objects.count()
    steps_of_old = Step.objects.filter(session=old).count()

    dry = apply_retention(parse_policy(POLICY), dry_run=True)
    assert (dry.deleted_sessions.sessions, dry.deleted_sessions.held) == (1, 1)
    assert (
        dry.deleted_sessions.rows == steps_of_old + Checkpoint.objects.filter(session=old).count()
    )
    assert dry.bytes > 0 and AgentSession.objects.filter(id=old.id).exists()
    assert AuditEvent.objects.count() == audit_before

    policy = parse_policy({**POLICY, "archive_dir": str(tmp_path / "archive")})
    done = apply_retention(policy)
    assert (
        done.deleted_sessions.sessions == 1
        and done.deleted_sessions.rows == dry.deleted_sessions.rows
    )
    remaining = set(AgentSession.objects.values_list("id", flat=True))
    assert old.id not in remaining
    assert {recent.id, held.id, live.id, kept_failed.id} <= remaining
    assert not Step.objects.filter(session_id=old.id).exists()
    # The audit log is never pruned: every record of the deleted session is still there,
    # and the deletion itself is on it, with counts, not contents.
    assert AuditEvent.objects.filter(session_id=old.id, action="start").exists()
    [event] = AuditEvent.objects.filter(action="retention_delete")
    assert event.session_id == old.id and event.after["steps"] == steps_of_old
    assert event.actor_label == "retention" and event.after["archive"] == done.archived[0]
    # The archive was written first, and it is the whole session: it imports back.
    with open(done.archived[0], "rb") as archived:
        back = import_session(archived.read()).session
    assert back.id == old.id and Step.objects.filter(session=back).count() == steps_of_old


def test_old_checkpoints_are_thinned_to_the_last_and_one_a_day(settings):
    session = run_inline(session_start(agent="slow", input="count to 6"))
    rows = list(Checkpoint.objects.filter(session=session).order_by("seq"))
    assert len(rows) >= 6
    # The checkpoints were written over the last days: two a day, the newest today.
    now = timezone.now()
    for index, row in enumerate(reversed(rows)):
        Checkpoint.objects.filter(id=row.id).update(
            created_at=now - (index // 2) * DAY - index * timedelta(minutes=1)
        )
    policy = parse_policy(
        {"default": {"checkpoints": {"after_days": 0.5, "keep_last": 2, "keep_daily": True}}}
    )
    summary = apply_retention(policy)
    kept = list(Checkpoint.objects.filter(session=session).order_by("-seq"))
    by_day = {}
    for row in rows:
        fresh = Checkpoint.objects.filter(id=row.id).first()
        if fresh is not None:
            by_day.setdefault(fresh.created_at.date(), []).append(fresh.seq)
    assert kept[0].seq == session.head  # the head is always kept
    assert {c.seq for c in kept} >= {r.seq for r in rows[-2:]}  # the last two
    assert all(len(seqs) == 1 or day == now.date() for day, seqs in by_day.items())
    assert summary.checkpoints.rows == len(rows) - len(kept) > 0
    [event] = AuditEvent.objects.filter(action="retention_checkpoints")
    assert event.after["deleted"] == summary.checkpoints.rows
    # What is left still loads and runs on.
    session_store().load_head(str(session.id))
    from sessions_app.services.core import session_send_message

    session_send_message(session_id=session.id, content="count to 2")
    assert run_inline(session).status == Status.COMPLETED


def test_old_superseded_steps_are_compacted_and_the_session_runs_on():
    session = run_inline(session_start(agent="demo", input="what is (1+2)*3, then save it"))
    checkpoint_rollback(session_id=session.id, checkpoint_seq=7)
    superseded = Step.objects.filter(session=session, superseded_at__isnull=False)
    count = superseded.count()
    assert count > 0
    superseded.update(superseded_at=timezone.now() - 40 * DAY)
    summary = apply_retention(parse_policy({"default": {"superseded_after_days": 30}}))
    assert summary.superseded_steps.rows == count
    session.refresh_from_db()
    assert session.compacted_steps == count and not superseded.exists()
    head = session_store().load_tail(str(session.id))
    live = Step.objects.filter(session=session).count()
    assert sum(head.step_versions.values()) == live  # the tail's count knows the gap
    session_resume(session_id=session.id)
    assert run_inline(session).final_answer.startswith("(1+2)*3 = 9")


def test_the_command_proves_first_with_a_dry_run(settings):
    finished(days=40)
    settings.RESPAWN_RETENTION = POLICY
    out = StringIO()
    call_command("apply_retention", "--dry-run", stdout=out, stderr=StringIO())
    assert "finished sessions: would delete" in out.getvalue()
    assert "dry run: nothing was deleted" in out.getvalue()
    assert AgentSession.objects.count() == 1
    out = StringIO()
    call_command("apply_retention", stdout=out, stderr=StringIO())
    assert "deleted 4 steps and checkpoints of 1 session(s)" in out.getvalue()
    assert AgentSession.objects.count() == 0
    with pytest.raises(CommandError, match="--batch-size must be at least 1"):
        call_command("apply_retention", "--batch-size", "0")
    settings.RESPAWN_RETENTION = {}
    out = StringIO()
    call_command("apply_retention", stdout=out)
    assert "no retention policy is configured" in out.getvalue()


def test_a_run_killed_mid_way_and_run_again_deletes_each_row_once(worker_env):
    sessions = [finished(days=40) for _ in range(8)]
    held = sessions[3]
    session_set_legal_hold(session_id=held.id, hold=True, note="litigation")
    rows = {
        s.id: Step.objects.filter(session=s).count() + Checkpoint.objects.filter(session=s).count()
        for s in sessions
    }
    env = {**worker_env, "RESPAWN_RETENTION": json.dumps(POLICY)}

    def command(*args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "manage.py", "apply_retention", "--batch-size", "1", *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    first = command("--pause", "0.5")
    wait_for(
        lambda: AuditEvent.objects.filter(action="retention_delete").count() >= 2,
        timeout=60,
        what="two deletions",
    )
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    gone = AuditEvent.objects.filter(action="retention_delete").count()
    assert 2 <= gone < 7
    time.sleep(0.2)
    second = command()
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    events = AuditEvent.objects.filter(action="retention_delete")
    assert events.count() == 7  # each session once, over both runs
    assert sorted(e.after["steps"] + e.after["checkpoints"] for e in events) == sorted(
        n for sid, n in rows.items() if sid != held.id
    )
    assert list(AgentSession.objects.values_list("id", flat=True)) == [held.id]
    session_store().load_head(str(held.id))


def test_operators_hold_sessions_in_the_dashboard_and_the_api(client, users):
    session = finished()
    client.force_login(users["viewer"])
    url = reverse("sessions:action", args=[session.id, "hold"])
    assert client.post(url, {"note": "case 1"}).status_code == 403
    client.force_login(users["operator"])
    refused = client.post(url, {"note": ""}, HTTP_HX_REQUEST="true")
    assert refused.status_code == 400 and b"say why the session is held" in refused.content
    assert client.post(url, {"note": "case 1"}).status_code in (200, 302)
    session.refresh_from_db()
    assert session.legal_hold and session.legal_hold_note == "case 1"
    page = client.get(reverse("sessions:detail", args=[session.id])).content.decode()
    assert "legal hold" in page and "case 1" in page
    token = {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(users['operator'])[1]}"}
    released = client.post(
        f"/api/sessions/{session.id}/hold", {"hold": False}, "application/json", **token
    )
    assert released.status_code == 200 and released.json()["legal_hold"] is False
    assert list(
        AuditEvent.objects.filter(session=session, action__startswith="legal_hold")
        .values_list("action", flat=True)
        .order_by("created_at")
    ) == ["legal_hold", "legal_hold_release"]
