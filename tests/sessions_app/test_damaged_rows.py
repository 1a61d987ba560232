"""No stored row takes a page down: a row written by hand with SQL (or by an older release)
holding what Python cannot read (a time past the year 9999 in UTC, or before the year 1)
or JSON of the wrong shape is shown as damaged, with links to repair or delete it in the
admin, and every page that lists it answers 200."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.urls import reverse

from sessions_app.models import AgentSession, ApiToken, AuditEvent, Checkpoint, Step
from sessions_app.services.core import session_start

from ..conftest import run_inline

pytestmark = pytest.mark.django_db(transaction=True)

# Both are fine for PostgreSQL's timestamptz; in UTC the first is in the year 10000 and the
# second in 1 BC, which no Python datetime holds.
AFTER_9999 = "9999-12-31T23:59:59-05:00"
BEFORE_1 = "0001-01-01T00:00:00+05:00"


def sql(statement: str, *params) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


@pytest.fixture
def damaged():
    """Sessions whose rows were damaged by hand: times out of Python's range on the session,
    a step, a checkpoint and an audit record; step, checkpoint and audit JSON of the wrong
    shape; a status this code does not know; a head with no checkpoint, progress past its
    total and counters at their limit."""
    late = run_inline(session_start(agent="demo", input="what is (12*7)+3, then save it"))
    early = run_inline(session_start(agent="demo", input="what is 2+2"))
    waiting = run_inline(session_start(agent="approval", input="pay invoice INV-9 to ACME"))
    sql(
        "UPDATE sessions_app_agentsession SET created_at = %s, updated_at = %s WHERE id = %s",
        AFTER_9999,
        AFTER_9999,
        late.id,
    )
    sql("UPDATE sessions_app_agentsession SET updated_at = %s WHERE id = %s", BEFORE_1, early.id)
    sql(
        "UPDATE sessions_app_agentsession SET lease_expires_at = %s, updated_at = %s WHERE id = %s",
        BEFORE_1,
        AFTER_9999,
        waiting.id,
    )
    sql(
        "UPDATE sessions_app_step SET started_at = %s, finished_at = %s, created_at = %s"
        " WHERE session_id = %s",
        AFTER_9999,
        BEFORE_1,
        AFTER_9999,
        late.id,
    )
    sql(
        "UPDATE sessions_app_checkpoint SET created_at = %s WHERE session_id = %s",
        BEFORE_1,
        late.id,
    )
    # JSON of the wrong shape: a step's payload and the head checkpoint's state.
    sql(
        "UPDATE sessions_app_step SET payload = '\"not an object\"'::jsonb"
        " WHERE session_id = %s AND seq IN (1, 3)",
        early.id,
    )
    sql("UPDATE sessions_app_checkpoint SET state = '[1, 2]' WHERE session_id = %s", early.id)
    for when, before in ((AFTER_9999, '"not an object"'), (BEFORE_1, "[1, 2]")):
        sql(
            "INSERT INTO sessions_app_auditevent"
            " (actor_label, action, session_id, before, after, request_meta, created_at)"
            " VALUES ('by hand', 'resume', %s, %s::jsonb, 'null'::jsonb, '7'::jsonb, %s)",
            late.id,
            before,
            when,
        )
    # Columns out of step with each other: a head with no checkpoint, progress past its
    # total, counters at their column's limit.
    sql(
        "UPDATE sessions_app_agentsession SET head = 999, progress_done = 5, progress_total = 0,"
        " tokens_in = 9223372036854775807, tokens_out = 9223372036854775807,"
        " cost = 999999.999999 WHERE id = %s",
        waiting.id,
    )
    unknown = session_start(agent="echo", input="hello")
    sql(
        "UPDATE sessions_app_agentsession SET status = 'zombie', dispatched_at = 'infinity',"
        " incompatible_at = '-infinity' WHERE id = %s",
        unknown.id,
    )
    return [late, early, waiting, unknown]


def test_every_list_page_answers_200_and_shows_the_damaged_rows(damaged, client, users):
    admin = User.objects.create_superuser("root", password="pw-root")
    pages = [
        reverse("sessions:list"),
        reverse("sessions:list") + "?sort=created",
        reverse("sessions:list") + "?status=waiting_input",
        reverse("sessions:charts"),
        reverse("sessions:attention"),
        reverse("sessions:costs"),
        reverse("audit"),
        reverse("audit") + f"?session={damaged[0].id}",
    ]
    for session in damaged:
        pages += [
            reverse("sessions:detail", args=[session.id]),
            reverse("sessions:row", args=[session.id]),
        ]
    admin_pages = [
        "/admin/sessions_app/agentsession/",
        "/admin/sessions_app/step/",
        "/admin/sessions_app/checkpoint/",
        "/admin/sessions_app/auditevent/",
    ]
    for session in damaged:
        admin_pages += [
            f"/admin/sessions_app/agentsession/{session.id}/change/",
            f"/admin/sessions_app/agentsession/{session.id}/delete/",
        ]
    for model in (Step, Checkpoint):
        for pk in model.objects.filter(session__in=damaged[:3], seq__lte=3).values_list("pk"):
            admin_pages.append(f"/admin/sessions_app/{model._meta.model_name}/{pk[0]}/change/")
    answers = {}
    client.raise_request_exception = False  # a 500 is an answer to report, with the others
    client.force_login(users["viewer"])
    for page in pages:
        answers[page] = client.get(page)
    client.force_login(admin)
    for page in admin_pages:
        answers["admin " + page] = client.get(page)
    token = ApiToken.issue(users["viewer"])[1]
    for path in ("/api/sessions", "/api/sessions?status=completed", "/api/usage"):
        answers[path] = client.get(path, HTTP_AUTHORIZATION=f"Bearer {token}")
    for session in damaged:
        for path in (f"/api/sessions/{session.id}", f"/api/sessions/{session.id}/steps"):
            answers[path] = client.get(path, HTTP_AUTHORIZATION=f"Bearer {token}")
    statuses = {page: r.status_code for page, r in answers.items()}
    # Every page answers 200 (286, htmx's "stop polling", for the row of a final session);
    # the admin's delete page refuses (403) for every session, by design: a session is
    # never deleted there.
    assert {p: s for p, s in statuses.items() if s not in (200, 286) and "/delete/" not in p} == {}
    assert {s for p, s in statuses.items() if "/delete/" in p} == {403}

    # The list says which rows are damaged, and links to their repair and edit in the admin
    # (a session is never deleted there: retention deletes, an operator cancels).
    listed = answers[reverse("sessions:list")].content.decode()
    for session in damaged:
        assert f"/admin/sessions_app/agentsession/?q={session.id}" in listed
        assert f"/admin/sessions_app/agentsession/{session.id}/change/" in listed
    assert listed.count('class="badge damaged"') == len(damaged)
    listed_by_api = {s["id"]: s["damaged"] for s in answers["/api/sessions"].json()["items"]}
    assert listed_by_api[str(damaged[0].id)] == [
        "created_at is outside the years 1 to 9999",
        "updated_at is outside the years 1 to 9999",
    ]
    assert listed_by_api[str(damaged[3].id)] == [
        "dispatched_at is outside the years 1 to 9999",
        "incompatible_at is outside the years 1 to 9999",
        "status 'zombie' is not one this code knows",
    ]
    assert all(listed_by_api[str(s.id)] for s in damaged)


def test_the_admin_repairs_a_damaged_session_and_audits_it(damaged, client):
    admin = User.objects.create_superuser("root", password="pw-root")
    client.force_login(admin)
    late = damaged[0]
    assert AgentSession.objects.get(id=late.id).damage() == [
        "created_at is outside the years 1 to 9999",
        "updated_at is outside the years 1 to 9999",
    ]
    response = client.post(
        "/admin/sessions_app/agentsession/",
        {"action": "repair_times_sessions", "_selected_action": [str(late.id)]},
    )
    assert response.status_code == 302
    assert AgentSession.objects.get(id=late.id).damage() == []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM sessions_app_step WHERE session_id = %s AND ("
            " started_at > '9999-12-30' OR finished_at < '0001-01-02' OR created_at > '9999-12-30')",
            [late.id],
        )
        assert cursor.fetchone() == (0,)
    record = AuditEvent.objects.get(session_id=late.id, action="repair_times")
    assert record.actor_label == "root"
    assert record.after["moved_to_now"]["step.started_at"] == late.step_count
    assert record.after["moved_to_now"]["checkpoint.created_at"] >= 1
