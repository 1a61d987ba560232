"""The Django admin: pages for staff only, edits through the state schema and the audit
log, read-only history, actions through the operator services, and changelists that
never count a whole table."""

from __future__ import annotations

import json
import re
import uuid
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Group, Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from agent_runtime.state import SCHEMA_VERSION
from sessions_app.admin.registry import LargeTablePaginator
from sessions_app.models import (
    AgentSession,
    ApiToken,
    AuditEvent,
    Checkpoint,
    Kind,
    Reason,
    Status,
    Step,
)
from sessions_app.services import records as admin_services
from sessions_app.services.core import ActionError, session_start
from sessions_app.store import session_store

from ..conftest import run_inline

pytestmark = pytest.mark.django_db

MODELS = ["agentsession", "step", "checkpoint", "auditevent", "apitoken"]


def admin_url(model: str, view: str = "changelist", *args) -> str:
    return reverse(f"admin:sessions_app_{model}_{view}", args=args)


@pytest.fixture
def staff(users) -> User:
    """A staff member who may view and change the app's records and operate sessions."""
    user = User.objects.create_user("stella", password="pw-staff", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="sessions_app"))
    user.groups.add(Group.objects.get(name="operator"))
    return User.objects.get(pk=user.pk)  # fresh permission cache


@pytest.fixture
def demo(users) -> AgentSession:
    """A finished demo session: 13 steps, checkpoints at 7, 12 and 13."""
    session = session_start(agent="demo", input="what is (12*7)+3, then save it as a note")
    run_inline(session)
    session.refresh_from_db()
    assert session.status == Status.COMPLETED
    return session


def tool_result(session: AgentSession) -> Step:
    return Step.objects.filter(session=session, kind=Kind.TOOL_RESULT).order_by("seq").first()


def head_checkpoint(session: AgentSession) -> Checkpoint:
    return Checkpoint.objects.filter(session=session, seq=session.head).order_by("-id").first()


def hold_lease(session: AgentSession) -> None:
    AgentSession.objects.filter(id=session.id).update(
        status=Status.RUNNING,
        lease_owner="worker-1",
        lease_expires_at=timezone.now() + timedelta(minutes=5),
    )


def change_data(response) -> dict:
    """The POST a browser would send for the change form on this page."""
    form = response.context["adminform"].form
    return {name: form[name].value() for name in form.fields}


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


# --- Who may see the admin ------------------------------------------------------------------


def every_page(demo: AgentSession) -> list[str]:
    token, _ = ApiToken.issue(User.objects.get(username="victor"), "ci")
    step, checkpoint = tool_result(demo), head_checkpoint(demo)
    event = AuditEvent.objects.filter(session=demo).first()
    return [
        *(admin_url(model) for model in MODELS),
        admin_url("agentsession", "change", demo.pk),
        admin_url("step", "change", step.pk),
        admin_url("checkpoint", "change", checkpoint.pk),
        admin_url("auditevent", "change", event.pk),
        admin_url("apitoken", "change", token.pk),
        admin_url("apitoken", "add"),  # the only model that takes an add
        # Each filter, a search and a date drill-down.
        admin_url("agentsession") + "?status=failed",
        admin_url("agentsession") + "?agent=demo",
        admin_url("agentsession") + "?stuck=yes",
        admin_url("agentsession") + f"?head_version={SCHEMA_VERSION}",
        admin_url("agentsession") + "?head_version=newer",
        admin_url("agentsession") + "?q=note",
        admin_url("agentsession") + f"?q={demo.id}",
        admin_url("agentsession") + f"?created_at__year={demo.created_at.year}",
        admin_url("step") + f"?session={demo.id}",
        admin_url("step") + "?kind=tool_result",
        admin_url("step") + f"?schema_version={SCHEMA_VERSION}",
        admin_url("step") + f"?q={demo.id}",
        admin_url("checkpoint") + f"?session={demo.id}",
        admin_url("checkpoint") + "?reason=auto",
        admin_url("checkpoint") + "?schema_version=newer",
        admin_url("auditevent") + "?action=start",
        admin_url("auditevent") + f"?session={demo.id}",
        admin_url("apitoken") + "?state=active",
    ]


def test_every_admin_page_renders_for_staff(client, demo, staff):
    client.force_login(staff)
    for url in every_page(demo):
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)


def test_every_admin_page_is_refused_to_non_staff(client, demo, users):
    for url in every_page(demo):
        for user in (None, users["operator"], users["viewer"], users["outsider"]):
            client.logout()
            if user:
                client.force_login(user)
            response = client.get(url)
            assert response.status_code == 302, (url, user, response.status_code)
            assert response["Location"].startswith(reverse("admin:login")), url


def test_history_cannot_be_added_or_deleted_even_by_a_superuser(client, demo):
    client.force_login(User.objects.create_superuser("sue", password="pw"))
    step, checkpoint = tool_result(demo), head_checkpoint(demo)
    event = AuditEvent.objects.filter(session=demo).first()
    for model in ("agentsession", "step", "checkpoint", "auditevent"):
        assert client.get(admin_url(model, "add")).status_code == 403, model
    for model, pk in [
        ("agentsession", demo.pk),
        ("step", step.pk),
        ("checkpoint", checkpoint.pk),
        ("auditevent", event.pk),
    ]:
        assert client.get(admin_url(model, "delete", pk)).status_code == 403, model
        assert client.post(admin_url(model, "delete", pk), {"post": "yes"}).status_code == 403
    assert AgentSession.objects.filter(pk=demo.pk).exists()
    assert Step.objects.filter(pk=step.pk).exists()
    # Nor is there a bulk delete.
    page = client.get(admin_url("agentsession")).content.decode()
    assert "delete_selected" not in page


def test_audit_events_cannot_be_edited_by_a_superuser(client, demo):
    client.force_login(User.objects.create_superuser("sue", password="pw"))
    event = AuditEvent.objects.filter(session=demo).first()
    page = client.get(admin_url("auditevent", "change", event.pk))
    assert page.status_code == 200
    assert b'name="_save"' not in page.content  # view only
    response = client.post(
        admin_url("auditevent", "change", event.pk), {"action": "forged", "actor_label": "x"}
    )
    assert response.status_code == 403
    event.refresh_from_db()
    assert event.action == "start"


def test_admin_index_links_to_the_queue_views_for_staff(client):
    client.force_login(User.objects.create_superuser("sue", password="pw"))
    index = client.get(reverse("admin:index")).content.decode()
    assert reverse("admin:django_rq_dashboard_changelist") in index
    assert client.get("/admin/rq/").status_code == 200
    client.logout()
    client.force_login(User.objects.create_user("olga"))
    assert client.get("/admin/rq/").status_code == 302


# --- Links between the admin and the dashboard -----------------------------------------------


def test_session_page_links_to_dashboard_steps_checkpoints_and_audit(client, demo, staff):
    client.force_login(staff)
    page = client.get(admin_url("agentsession", "change", demo.pk)).content.decode()
    assert f'href="{reverse("sessions:detail", args=[demo.id])}"' in page
    assert f'href="{admin_url("step")}?session={demo.id}"' in page
    assert f'href="{admin_url("checkpoint")}?session={demo.id}"' in page
    assert f'href="{admin_url("auditevent")}?session={demo.id}"' in page


def test_steps_of_a_session_are_listed_in_trace_order(client, demo, staff):
    client.force_login(staff)
    response = client.get(admin_url("step") + f"?session={demo.id}")
    seqs = [step.seq for step in response.context["cl"].result_list]
    assert seqs == list(range(1, 14))
    everything = client.get(admin_url("step"))
    ids = [step.id for step in everything.context["cl"].result_list]
    assert ids == sorted(ids, reverse=True)  # across sessions: newest first


def test_dashboard_header_links_back_to_the_admin_for_staff_only(client, demo, staff, users):
    link = admin_url("agentsession", "change", demo.pk)
    client.force_login(staff)
    # Staff with a dashboard role (the operator group) see the link...
    assert link in client.get(reverse("sessions:detail", args=[demo.id])).content.decode()
    header = client.get(reverse("sessions:panel", args=[demo.id]) + "?part=header")
    assert link in header.content.decode()
    # ...operators who are not staff do not.
    client.force_login(users["operator"])
    assert link not in client.get(reverse("sessions:detail", args=[demo.id])).content.decode()


# --- Edits ----------------------------------------------------------------------------------


def test_invalid_json_is_a_field_error_and_saves_nothing(client, demo, staff):
    client.force_login(staff)
    step = tool_result(demo)
    before = step.payload
    response = client.post(admin_url("step", "change", step.pk), {"payload": '{"ok": true,'})
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["payload"] == ["Enter a valid JSON."]
    assert "{&quot;ok&quot;: true," in response.content.decode()  # what was typed is kept
    step.refresh_from_db()
    assert step.payload == before
    assert not AuditEvent.objects.filter(action__startswith="admin_").exists()
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("[1, 2, 3]", "payload does not load at schema version"),
        ('"just a string"', "payload does not load at schema version"),
        ("null", "Give a JSON object here (an empty field or null is not one)."),
        ("{}", "tool_result payload needs a call_id and a name"),
    ],
)
def test_step_payload_the_schema_rejects_saves_nothing(client, demo, staff, payload, message):
    client.force_login(staff)
    step = tool_result(demo)
    before = step.payload
    response = client.post(admin_url("step", "change", step.pk), {"payload": payload})
    assert response.status_code == 200
    assert message in " ".join(response.context["adminform"].form.errors["payload"])
    step.refresh_from_db()
    assert step.payload == before
    assert not AuditEvent.objects.filter(action__startswith="admin_").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        # Each message names the field, in one sentence: no chain of loaders, no KeyError.
        (
            lambda s: s.pop("agent"),
            "does not load at schema version 3: state: missing the key(s) agent",
        ),
        (lambda s: s["agent"].pop("name"), "agent: missing the key(s) name"),
        (
            lambda s: [s.pop(key) for key in list(s) if key != "schema_version"],
            "state: missing the key(s) agent, plan",
        ),
        (lambda s: s.update(counters={"steps": "many"}) or s.pop("plan"), "does not load"),
        (lambda s: s.update(schema_version=99), "schema_version must stay"),
        (lambda s: s.update(plan=[{"title": "x"}]), "does not load"),
        # What used to be saved "successfully" and then failed every page and run.
        (
            lambda s: s["budgets"].update(max_steps="ten"),
            "budgets.max_steps: expected an integer >= 1, got 'ten'",
        ),
        (
            lambda s: s["budgets"].update(max_cost="abc"),
            "budgets.max_cost: expected a number >= 0, got 'abc'",
        ),
        (
            lambda s: s["budgets"].update(max_steps=-3),
            "budgets.max_steps: expected an integer >= 1, got -3",
        ),
        (
            lambda s: s.update(uncertain_calls="x"),
            "uncertain_calls: expected a list of strings, got 'x'",
        ),
        (lambda s: s.update(turn="3"), "turn: expected an integer >= 0, got '3'"),
        (lambda s: s.update(colour="blue"), "state: unknown key(s) colour"),
        (lambda s: s["budgets"].update(max_step=9), "budgets: unknown key(s) max_step"),
    ],
)
def test_checkpoint_state_the_schema_rejects_saves_nothing(client, demo, staff, change, message):
    client.force_login(staff)
    checkpoint = head_checkpoint(demo)
    before = checkpoint.state
    state = json.loads(json.dumps(before))
    change(state)
    response = client.post(
        admin_url("checkpoint", "change", checkpoint.pk), {"state": json.dumps(state)}
    )
    assert response.status_code == 200
    errors = " ".join(response.context["adminform"].form.errors["state"])
    assert message in errors
    assert "cannot be read" not in errors and "does not match schema version" not in errors
    checkpoint.refresh_from_db()
    assert checkpoint.state == before
    assert not AuditEvent.objects.filter(action__startswith="admin_").exists()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("[1, 2]", "A checkpoint state must be a JSON object."),
        ('"text"', "A checkpoint state must be a JSON object."),
        ("null", "Give a JSON object here (an empty field or null is not one)."),
        ("{}", "The state's schema_version must stay 3 (found None)."),
    ],
)
def test_a_checkpoint_state_that_is_not_a_state_object_is_refused(
    client, demo, staff, raw, message
):
    client.force_login(staff)
    checkpoint = head_checkpoint(demo)
    before = checkpoint.state
    response = client.post(admin_url("checkpoint", "change", checkpoint.pk), {"state": raw})
    assert response.context["adminform"].form.errors["state"] == [message]
    checkpoint.refresh_from_db()
    assert checkpoint.state == before


@pytest.mark.parametrize(
    ("budgets", "message"),
    [
        ({"max_steps": "ten"}, "budgets.max_steps: expected an integer >= 1, got 'ten'"),
        ({"max_steps": -3}, "budgets.max_steps: expected an integer >= 1, got -3"),
        ({"max_cost": "abc"}, "budgets.max_cost: expected a number >= 0, got 'abc'"),
        ({"max_tokens": 2.5}, "budgets.max_tokens: expected an integer >= 0, got 2.5"),
        ({"max_step": 9}, "budgets: unknown key(s) max_step"),
        ("lots", "budgets: expected an object, got 'lots'"),
    ],
)
def test_a_budget_step_the_run_could_not_apply_is_refused(client, staff, budgets, message):
    """A set_budgets operator step is folded into the state by the next run: a value the
    state refuses would fail every run, so the admin refuses it first."""
    session = session_start(agent="echo", input="hi", budgets={"max_steps": 7})
    step = Step.objects.get(session=session, kind=Kind.OPERATOR)
    assert step.payload["budgets"] == {"max_steps": 7}
    client.force_login(staff)
    payload = {**step.payload, "budgets": budgets}
    response = client.post(admin_url("step", "change", step.pk), {"payload": json.dumps(payload)})
    assert response.status_code == 200
    assert message in " ".join(response.context["adminform"].form.errors["payload"])
    step.refresh_from_db()
    assert step.payload["budgets"] == {"max_steps": 7}


def test_a_step_edit_is_audited_with_the_full_before_and_after(client, demo, staff):
    client.force_login(staff)
    step = tool_result(demo)
    original = step.payload
    edited = {**original, "output": {"value": 88}, "ok": True}
    token = demo.fencing_token
    response = client.post(admin_url("step", "change", step.pk), {"payload": json.dumps(edited)})
    assert response.status_code == 302, response.context and response.context["errors"]
    step.refresh_from_db()
    assert step.payload == edited
    event = AuditEvent.objects.get(action="admin_edit_step")
    assert event.actor == staff and event.session_id == demo.id
    assert event.before == {
        "step": step.seq,
        "kind": "tool_result",
        "schema_version": step.schema_version,
        "payload": original,
        "fencing_token": token,
    }
    assert event.after == {
        "step": step.seq,
        "kind": "tool_result",
        "schema_version": step.schema_version,
        "payload": edited,
        "fencing_token": token + 1,
    }
    assert event.request_meta["via"] == "admin"
    demo.refresh_from_db()
    assert demo.fencing_token == token + 1  # a worker that loaded the old history is fenced


def test_an_unchanged_save_writes_no_audit_event(client, demo, staff):
    client.force_login(staff)
    step = tool_result(demo)
    page = client.get(admin_url("step", "change", step.pk))
    response = client.post(admin_url("step", "change", step.pk), change_data(page))
    assert response.status_code == 302
    assert not AuditEvent.objects.filter(action__startswith="admin_").exists()


def test_read_only_fields_of_a_step_cannot_be_changed_by_a_crafted_post(client, demo, staff):
    client.force_login(staff)
    step = tool_result(demo)
    other = session_start(agent="echo", input="hi")
    snapshot = Step.objects.filter(pk=step.pk).values().get()
    edited = {**step.payload, "output": "corrected"}
    response = client.post(
        admin_url("step", "change", step.pk),
        {
            "payload": json.dumps(edited),
            "session": str(other.id),
            "seq": 999,
            "kind": "user",
            "schema_version": 99,
            "superseded_at": "2020-01-01 00:00:00",
            "created_at": "2020-01-01 00:00:00",
            "idempotency_key": "forged",
            "tokens_in": 12345,
        },
    )
    assert response.status_code == 302
    after = Step.objects.filter(pk=step.pk).values().get()
    assert after == {**snapshot, "payload": edited}


def test_read_only_fields_of_a_session_cannot_be_changed_by_a_crafted_post(client, demo, staff):
    client.force_login(staff)
    snapshot = AgentSession.objects.filter(pk=demo.pk).values().get()
    response = client.post(
        admin_url("agentsession", "change", demo.pk),
        {
            "title": "Renamed by hand",
            "status": "queued",
            "agent": "slow",
            "head": 1,
            "last_seq": 1,
            "fencing_token": 0,
            "lease_owner": "me",
            "lease_expires_at": "2999-01-01 00:00:00",
            "cancel_requested": "on",
            "final_answer": "forged",
            "created_at": "2020-01-01 00:00:00",
        },
    )
    assert response.status_code == 302
    after = AgentSession.objects.filter(pk=demo.pk).values().get()
    assert after == {**snapshot, "title": "Renamed by hand"}
    event = AuditEvent.objects.get(action="admin_edit_session")
    assert (event.before, event.after) == (
        {"title": snapshot["title"]},
        {"title": "Renamed by hand"},
    )


def test_read_only_fields_of_a_checkpoint_cannot_be_changed_by_a_crafted_post(client, demo, staff):
    client.force_login(staff)
    checkpoint = Checkpoint.objects.get(session=demo, seq=7)
    snapshot = Checkpoint.objects.filter(pk=checkpoint.pk).values().get()
    state = {**checkpoint.state, "memory_refs": ["doc:42"]}
    response = client.post(
        admin_url("checkpoint", "change", checkpoint.pk),
        {
            "state": json.dumps(state),
            "seq": 1,
            "reason": "manual",
            "schema_version": 99,
            "session": str(uuid.uuid4()),
        },
    )
    assert response.status_code == 302
    after = Checkpoint.objects.filter(pk=checkpoint.pk).values().get()
    assert after == {**snapshot, "state": state}
    event = AuditEvent.objects.get(action="admin_edit_checkpoint")
    assert event.before["state"] == snapshot["state"] and event.after["state"] == state


def test_editing_the_head_checkpoint_answer_updates_the_session_copy(demo, staff):
    checkpoint = head_checkpoint(demo)
    state = {**checkpoint.state, "final_answer": "87, checked by hand"}
    admin_services.checkpoint_edit_state(checkpoint_id=checkpoint.pk, state=state, actor=staff)
    demo.refresh_from_db()
    assert demo.final_answer == "87, checked by hand"
    event = AuditEvent.objects.get(action="admin_edit_checkpoint")
    assert event.after["session_final_answer"] == "87, checked by hand"


def test_an_edit_of_a_running_session_is_refused(client, demo, staff):
    client.force_login(staff)
    step = tool_result(demo)
    hold_lease(demo)
    before = step.payload
    response = client.post(
        admin_url("step", "change", step.pk),
        {"payload": json.dumps({**before, "output": "x"})},
    )
    assert response.status_code == 200
    assert "The session is running" in response.content.decode()
    step.refresh_from_db()
    assert step.payload == before
    assert not AuditEvent.objects.filter(action__startswith="admin_").exists()


def test_a_session_that_starts_running_after_validation_is_not_edited(
    client, demo, staff, monkeypatch
):
    """The race the form's check cannot close: the service refuses under the lock, the
    admin's transaction rolls back (no change, no log entry) and says why."""
    from sessions_app.admin import forms as admin_forms

    monkeypatch.setattr(
        admin_forms._SessionHistoryForm, "clean", lambda self: dict(self.cleaned_data)
    )
    client.force_login(staff)
    step = tool_result(demo)
    hold_lease(demo)
    before = step.payload
    response = client.post(
        admin_url("step", "change", step.pk),
        {"payload": json.dumps({**before, "output": "x"})},
        follow=True,
    )
    assert any("Nothing was saved: the session is running" in m for m in messages_of(response))
    step.refresh_from_db()
    assert step.payload == before
    assert not LogEntry.objects.exists()
    assert not AuditEvent.objects.filter(action__startswith="admin_").exists()


def test_the_edit_services_validate_on_their_own(demo, staff):
    step = tool_result(demo)
    with pytest.raises(ActionError, match="does not load"):
        admin_services.step_edit_payload(step_id=step.pk, payload=["no"], actor=staff)
    with pytest.raises(ActionError, match="schema_version must stay"):
        admin_services.checkpoint_edit_state(
            checkpoint_id=head_checkpoint(demo).pk,
            state={**head_checkpoint(demo).state, "schema_version": SCHEMA_VERSION + 1},
            actor=staff,
        )


def test_the_edit_services_refuse_missing_rows_and_running_sessions(demo, staff):
    step, checkpoint = tool_result(demo), head_checkpoint(demo)
    with pytest.raises(ActionError, match="no step with id 0") as missing:
        admin_services.step_edit_payload(step_id=0, payload=step.payload, actor=staff)
    assert missing.value.code == "not_found"
    with pytest.raises(ActionError, match="no checkpoint with id 0") as missing:
        admin_services.checkpoint_edit_state(checkpoint_id=0, state=checkpoint.state, actor=staff)
    assert missing.value.code == "not_found"
    hold_lease(demo)
    with pytest.raises(ActionError, match="the session is running") as running:
        admin_services.checkpoint_edit_state(
            checkpoint_id=checkpoint.pk, state={**checkpoint.state, "turn": 99}, actor=staff
        )
    assert running.value.code == "already_running"
    assert Checkpoint.objects.get(pk=checkpoint.pk).state == checkpoint.state


# --- Actions ----------------------------------------------------------------------------------


def act(client, action: str, *sessions: AgentSession):
    return client.post(
        admin_url("agentsession"),
        {"action": action, "_selected_action": [str(s.id) for s in sessions]},
        follow=True,
    )


def test_resume_action_queues_through_the_service_and_reports_each_session(client, demo, staff):
    AgentSession.objects.filter(id=demo.id).update(status=Status.FAILED, last_error="boom")
    done = session_start(agent="echo", input="hi")
    run_inline(done)
    client.force_login(staff)
    response = act(client, "resume_sessions", demo, done)
    notes = messages_of(response)
    assert any(str(demo.id) in m and m.endswith("queued") for m in notes), notes
    assert any(str(done.id) in m and "cannot be resumed" in m for m in notes), notes
    demo.refresh_from_db()
    assert demo.status == Status.QUEUED and demo.last_error == ""
    event = AuditEvent.objects.get(action="resume")
    assert event.session_id == demo.id and event.actor == staff
    assert event.request_meta["via"] == "admin"
    assert event.before["status"] == "failed" and event.after["status"] == "queued"


def test_cancel_action_cancels_through_the_service(client, staff, users):
    session = session_start(agent="echo", input="hi")
    client.force_login(staff)
    notes = messages_of(act(client, "cancel_sessions", session))
    assert any(m.endswith("cancelled") for m in notes), notes
    session.refresh_from_db()
    assert session.status == Status.CANCELLED
    assert AuditEvent.objects.filter(action="cancel", session=session, actor=staff).exists()


def test_rollback_action_rolls_back_to_the_latest_checkpoint(client, demo, staff):
    # Steps after the head checkpoint (a run that died after checkpoint 12).
    AgentSession.objects.filter(id=demo.id).update(head=12, status=Status.FAILED)
    Checkpoint.objects.filter(session=demo, seq=13).delete()
    client.force_login(staff)
    notes = messages_of(act(client, "rollback_sessions", demo))
    assert any("rolled back to checkpoint 12, paused" in m for m in notes), notes
    demo.refresh_from_db()
    assert demo.status == Status.PAUSED and demo.head == 12
    assert Step.objects.get(session=demo, seq=13).superseded_at is not None
    assert AuditEvent.objects.filter(action="rollback", session=demo, actor=staff).exists()
    # A second time, the before-rollback checkpoint it left is skipped: still 12.
    notes = messages_of(act(client, "rollback_sessions", demo))
    assert any("rolled back to checkpoint 12" in m for m in notes), notes


def test_rollback_action_reports_a_session_without_checkpoints(client, staff):
    session = session_start(agent="echo", input="hi")
    AgentSession.objects.filter(id=session.id).update(status=Status.FAILED)
    client.force_login(staff)
    notes = messages_of(act(client, "rollback_sessions", session))
    assert any("no checkpoint to roll back to" in m for m in notes), notes


def test_staff_without_the_operator_role_get_no_session_actions(client, demo, staff):
    staff.groups.clear()
    staff = User.objects.get(pk=staff.pk)
    AgentSession.objects.filter(id=demo.id).update(status=Status.FAILED)
    client.force_login(staff)
    page = client.get(admin_url("agentsession")).content.decode()
    assert "resume_sessions" not in page
    act(client, "resume_sessions", demo)
    demo.refresh_from_db()
    assert demo.status == Status.FAILED
    assert not AuditEvent.objects.filter(action="resume").exists()


# --- API tokens -------------------------------------------------------------------------------


@pytest.fixture
def token_admin(users) -> User:
    """A staff member of the `admin` group: issues and revokes other users' tokens."""
    user = User.objects.create_user("ada", password="pw-admin", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="sessions_app"))
    user.groups.add(Group.objects.get(name="admin"))
    return User.objects.get(pk=user.pk)


def test_issuing_a_token_shows_the_secret_once_and_stores_its_hash(client, token_admin, users):
    client.force_login(token_admin)
    response = client.post(
        admin_url("apitoken", "add"), {"user": users["operator"].pk, "name": "ci"}
    )
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    raw = re.search(r'<code id="issued-token">(rsp_[\w-]+)</code>', response.content.decode())[1]
    token = ApiToken.objects.get()
    assert token.user == users["operator"] and token.name == "ci"
    assert token.key_hash == ApiToken.hash(raw) and raw.startswith(token.key_prefix)
    # Shown this once: not on the token's page, not in the audit log or the admin's log.
    assert raw not in client.get(admin_url("apitoken", "change", token.pk)).content.decode()
    event = AuditEvent.objects.get(action="admin_issue_token")
    assert raw not in json.dumps([event.before, event.after])
    assert all(raw not in e.change_message + e.object_repr for e in LogEntry.objects.all())
    # And it works.
    api = client.get("/api/sessions", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api.status_code == 200


def test_tokens_are_revoked_not_edited(client, token_admin, users):
    token, _ = ApiToken.issue(users["operator"], "ci")
    client.force_login(token_admin)
    response = client.post(admin_url("apitoken", "change", token.pk), {"name": "renamed"})
    assert response.status_code == 403
    response = client.post(
        admin_url("apitoken"),
        {"action": "revoke_tokens", "_selected_action": [token.pk]},
        follow=True,
    )
    assert any("revoked" in m for m in messages_of(response))
    token.refresh_from_db()
    assert token.name == "ci" and token.revoked_at is not None
    event = AuditEvent.objects.get(action="admin_revoke_token")
    assert event.before["revoked_at"] is None and event.after["revoked_at"]


def test_an_operator_issues_and_revokes_only_their_own_tokens(client, staff, users):
    """Staff with every model permission and the operator role: a token acts with its
    user's role, so minting one for someone else is for admins only."""
    client.force_login(staff)
    form = client.get(admin_url("apitoken", "add")).content.decode()
    assert f'value="{staff.pk}"' in form and f'value="{users["operator"].pk}"' not in form
    response = client.post(
        admin_url("apitoken", "add"), {"user": users["operator"].pk, "name": "theirs"}
    )
    assert response.status_code == 200 and "issued-token" not in response.content.decode()
    assert not ApiToken.objects.exists()
    with pytest.raises(ActionError, match="only admins"):
        admin_services.api_token_issue(user=users["operator"], name="x", actor=staff)
    assert not ApiToken.objects.exists()
    response = client.post(admin_url("apitoken", "add"), {"user": staff.pk, "name": "mine"})
    assert "issued-token" in response.content.decode()
    assert ApiToken.objects.get().user == staff
    theirs, _ = ApiToken.issue(users["operator"], "theirs")
    response = client.post(
        admin_url("apitoken"),
        {"action": "revoke_tokens", "_selected_action": [theirs.pk]},
        follow=True,
    )
    assert any("only admins" in m for m in messages_of(response))
    theirs.refresh_from_db()
    assert theirs.revoked_at is None
    assert not AuditEvent.objects.filter(action="admin_revoke_token").exists()


# --- At scale: counts, filters and query budgets ----------------------------------------------


@pytest.fixture
def many(users):
    """More rows than a page holds, in every table the admin lists."""
    now = timezone.now()
    sessions = AgentSession.objects.bulk_create(
        [
            AgentSession(
                agent=["demo", "slow", "echo"][i % 3],
                title=f"bulk session {i}",
                status=[Status.COMPLETED, Status.FAILED, Status.QUEUED][i % 3],
                head=2,
                last_seq=3,
                step_count=3,
                created_at=now - timedelta(days=i),
                updated_at=now - timedelta(minutes=i),
            )
            for i in range(150)
        ]
    )
    Step.objects.bulk_create(
        [
            Step(session=s, seq=seq, kind=kind, payload={"text": "x" * 500, "n": seq})
            for s in sessions
            for seq, kind in [(1, "user"), (2, "model"), (3, "tool_result")]
        ]
    )
    state = {
        "schema_version": SCHEMA_VERSION,
        "agent": {"name": "demo", "version": "1"},
        "turn": 1,
        "plan": [],
        "memory_refs": [],
        "counters": {},
        "budgets": {},
        "pending_approval": None,
        "uncertain_calls": [],
        "batch_cursor": None,
        "final_answer": None,
    }
    Checkpoint.objects.bulk_create([Checkpoint(session=s, seq=2, state=state) for s in sessions])
    AuditEvent.objects.bulk_create(
        [AuditEvent(actor_label="system", action="start", session=s) for s in sessions]
    )
    return sessions


def unbounded_counts(queries) -> list[str]:
    """COUNT queries that could read a whole table: any without a LIMIT inside."""
    return [q["sql"] for q in queries if "COUNT(" in q["sql"].upper() and "LIMIT" not in q["sql"]]


LISTS = [
    admin_url("agentsession"),
    admin_url("agentsession") + "?status=failed",
    admin_url("agentsession") + "?agent=slow&stuck=yes",
    admin_url("agentsession") + f"?head_version={SCHEMA_VERSION}",
    admin_url("agentsession") + "?q=bulk",
    admin_url("agentsession") + "?p=2",
    admin_url("step"),
    admin_url("step") + "?kind=tool_result&p=2",
    admin_url("step") + f"?schema_version={SCHEMA_VERSION}",
    admin_url("checkpoint"),
    admin_url("checkpoint") + "?reason=auto",
    admin_url("auditevent"),
    admin_url("auditevent") + "?action=start",
]


@pytest.mark.parametrize("url", LISTS)
def test_a_changelist_over_many_rows_issues_bounded_queries_and_no_full_count(
    client, many, staff, url
):
    client.force_login(staff)
    client.get(url)  # warm the session and permission caches
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    # Log-in session, user, its permissions (2) and roles (the admin site's gate); the count
    # (an estimate and/or a capped count), the page, a filter's choices and the date
    # hierarchy's MIN/MAX.
    assert len(captured) <= 11, [q["sql"] for q in captured]
    assert not unbounded_counts(captured.captured_queries)
    assert not [q["sql"] for q in captured if "DISTINCT" in q["sql"] and "date_trunc" in q["sql"]]
    assert len(response.context["cl"].result_list) <= 100


def test_the_unfiltered_count_is_the_planner_estimate(client, many, staff, monkeypatch):
    monkeypatch.setattr(LargeTablePaginator, "max_rows", 100)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE sessions_app_agentsession")
    client.force_login(staff)
    with CaptureQueriesContext(connection) as captured:
        response = client.get(admin_url("agentsession"))
    assert "about 150 agent sessions" in response.content.decode()
    assert not [q for q in captured if "COUNT(" in q["sql"].upper()]
    filtered = client.get(admin_url("agentsession") + "?q=bulk")
    assert "more than 100 agent sessions" in filtered.content.decode()
    assert filtered.context["cl"].paginator.num_pages == 2  # pages stop at max_rows (50 a page)


def test_the_capped_count_is_exact_below_the_cap(many):
    paginator = LargeTablePaginator(
        AgentSession.objects.filter(status="failed").order_by("-id"), 20
    )
    assert paginator.count == 50 and paginator.count_label == "50"
    assert paginator.num_pages == 3
    capped = LargeTablePaginator(
        AgentSession.objects.filter(title__contains="bulk").order_by("-id"), 20
    )
    capped.max_rows = 120
    assert capped.count == 121 and capped.count_label == "more than 120"
    assert capped.num_pages == 6


def test_the_date_hierarchy_reads_only_the_first_and_last_date(client, many, staff):
    client.force_login(staff)
    year = timezone.localtime(many[0].created_at).year
    for query in ("", f"?created_at__year={year}"):
        with CaptureQueriesContext(connection) as captured:
            response = client.get(admin_url("agentsession") + query)
        assert response.status_code == 200
        ends = [
            q["sql"] for q in captured if re.search(r"ORDER BY 1 (ASC|DESC) LIMIT 1$", q["sql"])
        ]
        assert len(ends) == 2, [q["sql"] for q in captured]
        assert "date_trunc" not in " ".join(q["sql"].lower() for q in captured)
    months = re.findall(
        r'href="\?created_at__month=(\d+)&amp;created_at__year=(\d+)"',
        page := response.content.decode(),
    )
    assert months and all(y == str(year) for _, y in months), page


def test_the_stuck_filter_is_the_queryset_form_of_is_stuck(settings):
    now = timezone.now()
    live, expired = now + timedelta(minutes=1), now - timedelta(minutes=1)
    long_ago = now - timedelta(seconds=settings.RESPAWN_DISPATCH_GRACE + 60)
    cases = [
        dict(status=Status.RUNNING, lease_owner="w", lease_expires_at=live),
        dict(status=Status.RUNNING, lease_owner="w", lease_expires_at=expired),
        dict(status=Status.RUNNING, lease_owner=None, lease_expires_at=None),
        dict(status=Status.RUNNING, lease_owner="w", lease_expires_at=None),
        dict(status=Status.QUEUED, dispatched_at=None),
        dict(status=Status.QUEUED, dispatched_at=now),
        dict(status=Status.QUEUED, dispatched_at=long_ago),
        # Waits for code that can load it: not stuck (the admin's filter said it was).
        dict(status=Status.QUEUED, dispatched_at=long_ago, incompatible_at=now),
        dict(status=Status.QUEUED, dispatched_at=long_ago, lease_owner="w", lease_expires_at=live),
        dict(status=Status.PAUSED),
        dict(status=Status.FAILED, lease_owner="w", lease_expires_at=expired),
        dict(status=Status.COMPLETED),
    ]
    sessions = [AgentSession.objects.create(agent="demo", **case) for case in cases]
    expected = {s.id for s in sessions if s.is_stuck(now)}
    assert expected  # the matrix has both kinds
    assert set(
        AgentSession.objects.filter(AgentSession.stuck_q(now)).values_list("id", flat=True)
    ) == (expected)


def test_the_head_schema_version_filter_finds_sessions_by_their_head(client, demo, staff):
    newer = session_start(agent="echo", input="from the future")
    AgentSession.objects.filter(id=newer.id).update(head=1)
    Checkpoint.objects.create(
        session=newer,
        seq=1,
        state={"schema_version": SCHEMA_VERSION + 1},
        schema_version=SCHEMA_VERSION + 1,
        reason=Reason.MIGRATION,
    )
    client.force_login(staff)
    found = client.get(admin_url("agentsession") + "?head_version=newer").context["cl"]
    assert [s.id for s in found.result_list] == [newer.id]
    current = client.get(admin_url("agentsession") + f"?head_version={SCHEMA_VERSION}")
    assert [s.id for s in current.context["cl"].result_list] == [demo.id]


def test_search_finds_a_session_by_exact_id_or_title_words(client, demo, staff):
    other = session_start(agent="echo", input="something else entirely")
    client.force_login(staff)
    by_id = client.get(admin_url("agentsession") + f"?q={demo.id}").context["cl"]
    assert [s.id for s in by_id.result_list] == [demo.id]
    by_title = client.get(admin_url("agentsession") + "?q=save it as").context["cl"]
    assert [s.id for s in by_title.result_list] == [demo.id]
    steps = client.get(admin_url("step") + f"?q={demo.id}").context["cl"]
    assert [s.seq for s in steps.result_list] == list(range(1, 14))  # in trace order
    steps = client.get(admin_url("step") + f"?q={other.id}").context["cl"]
    assert {s.session_id for s in steps.result_list} == {other.id}
    assert not client.get(admin_url("step") + "?q=nonsense").context["cl"].result_list


def test_a_bad_session_filter_value_is_refused_not_a_crash(client, staff):
    client.force_login(staff)
    response = client.get(admin_url("step") + "?session=not-a-uuid")
    assert response.status_code == 302 and "e=1" in response["Location"]


# --- Done when ------------------------------------------------------------------------------------


def test_an_admin_finds_a_session_corrects_a_tool_result_and_resumes_it(client, demo, staff):
    """Search, correct the calculator's result in place, resume; the audit trail holds
    exactly what changed."""
    calculation = Step.objects.get(session=demo, kind=Kind.TOOL_RESULT, payload__name="calculator")
    right = calculation.payload["output"]
    wrong = {**right, "value": 86.0} if isinstance(right, dict) else 86
    Step.objects.filter(pk=calculation.pk).update(payload={**calculation.payload, "output": wrong})
    AgentSession.objects.filter(id=demo.id).update(
        status=Status.FAILED, last_error="the calculator was wrong"
    )
    client.force_login(staff)

    found = client.get(admin_url("agentsession") + "?q=12*7").context["cl"].result_list
    assert [s.id for s in found] == [demo.id]
    page = client.get(admin_url("agentsession", "change", demo.pk)).content.decode()
    steps_url = f"{admin_url('step')}?session={demo.id}"
    assert steps_url in page

    results = client.get(steps_url + "&kind=tool_result").context["cl"].result_list
    step = next(s for s in results if s.payload.get("name") == "calculator")
    original = dict(step.payload)
    form = change_data(client.get(admin_url("step", "change", step.pk)))
    assert original["output"] == wrong
    corrected = {**original, "output": right}
    form["payload"] = json.dumps(corrected)
    saved = client.post(admin_url("step", "change", step.pk), form, follow=True)
    assert any("was changed successfully" in m for m in messages_of(saved))

    resumed = act(client, "resume_sessions", demo)
    assert any(m.endswith(": queued") for m in messages_of(resumed))
    demo.refresh_from_db()
    assert demo.status == Status.QUEUED

    trail = list(AuditEvent.objects.filter(session=demo).order_by("id"))
    assert [e.action for e in trail] == ["start", "admin_edit_step", "resume"]
    edit = trail[1]
    assert edit.actor == staff
    assert edit.before["payload"] == original and edit.after["payload"] == corrected
    changed = {k for k in original if original[k] != corrected[k]}
    assert changed == {"output"}
    # The audit page shows both, in full.
    shown = client.get(admin_url("auditevent", "change", edit.pk)).content.decode()
    assert "&quot;value&quot;: 86.0" in shown and "&quot;value&quot;: 87" in shown

    # The worker picks it up from the head with the corrected result in its history.
    run_inline(demo)
    demo.refresh_from_db()
    assert demo.status == Status.COMPLETED
    head = session_store().load_head(str(demo.id))
    assert any(s.seq == step.seq and s.payload == corrected for s in head.history)


def test_compatibility_check_action_marks_and_clears(client, db):
    from django.contrib.auth.models import User

    from sessions_app.models import AgentSession, AuditEvent, Checkpoint
    from sessions_app.services.core import session_start

    admin_user = User.objects.create_superuser("compat-admin", password="pw")
    good = session_start(agent="echo", input="hi")
    bad = session_start(agent="echo", input="ho")
    Checkpoint.objects.create(session=bad, seq=1, state={"schema_version": 99}, reason="auto")
    AgentSession.objects.filter(id=bad.id).update(head=1)
    AgentSession.objects.filter(id=good.id).update(
        incompatible_reason="old mark", incompatible_at="2026-01-01T00:00:00Z"
    )
    client.force_login(admin_user)
    response = client.post(
        "/admin/sessions_app/agentsession/",
        {"action": "check_compat_sessions", "_selected_action": [str(good.id), str(bad.id)]},
        follow=True,
    )
    assert response.status_code == 200
    text = response.content.decode()
    assert "loads with this code" in text and "cannot be loaded" in text
    good.refresh_from_db()
    bad.refresh_from_db()
    assert good.incompatible_at is None
    assert bad.incompatible_at is not None and "schema version 99" in bad.incompatible_reason
    assert AuditEvent.objects.filter(action="compat_check").count() == 2
