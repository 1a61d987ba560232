"""The dashboard's actions table (sessions_app.dashboard.actions): every action in it has its
URL and is offered by a template; an anonymous user is sent to log in, a viewer and an
outsider are refused, and an operator takes it. The tests read the table, so an action added
to it is covered here without another line (and one added without a sample form or a
session it succeeds on fails here until it has them)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.urls import NoReverseMatch, Resolver404, resolve, reverse

from sessions_app.dashboard import views
from sessions_app.dashboard.actions import ACTIONS, BULK_ACTIONS, PREVIEWS, Action
from sessions_app.models import AgentSession, AuditEvent, GraphThread, Status, Step
from sessions_app.services.core import checkpoint_rollback, session_set_legal_hold, session_start

from ..conftest import run_inline
from .test_dashboard import _uncertain_notify_session

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}

# A value for every form field an action of the table reads (a field the table adds needs
# one here); each action posts only its own fields.
SAMPLE = {
    "checkpoint_seq": "7",
    "reason": "looked at it",
    "value": "yes",
    "resolution": "rerun",
    "output": '{"value": 88}',
    "note": "case 12",
    "content": "what is 2+2",
    "text": "be brief",
    "result_seq": "0",  # the `done` session's calculator result, filled in below
    "max_steps": "50",
    "max_tokens": "",
    "max_cost": "",
    "max_seconds": "",
    "resume": "",
    "seen_owner": "",  # the work queue: the owner the person saw (nobody)
    "to": "olivia",  # the operator of the `users` fixture
}

# The session each action succeeds on (the fixtures below), by the action's name.
SUCCEEDS_ON = {
    "resume": "paused",
    "cancel": "paused",
    "rollback": "done",
    "fork": "done",
    "approve": "waiting",
    "reject": "waiting",
    "answer": "graph",
    "uncertain": "uncertain",
    "message": "done",
    "instruct": "done",
    "correct": "done",
    "budgets": "done",
    "hold": "done",
    "release": "held",
    "take": "done",
    "hand": "done",
    "note": "done",
}


def form_of(name: str, session: AgentSession | None = None) -> dict[str, str]:
    form = {field: SAMPLE[field] for field in ACTIONS[name].fields}
    if "result_seq" in form and session is not None:
        result = session.steps.filter(kind="tool_result", payload__name="calculator").first()
        form["result_seq"] = str(result.seq if result else 1)
    return form


@pytest.fixture
def done(db):
    return run_inline(session_start(agent="demo", input="what is (12*7)+3, then save it as a note"))


def _graph_waiting_for_an_answer() -> AgentSession:
    """A LangGraph thread's session whose last run stopped in interrupt(), as the graph
    runner leaves it (tests/integration/test_langgraph_workers.py runs a real one)."""
    session = session_start(agent="demo", input="approve the refund")
    seq = session.last_seq + 1
    GraphThread.objects.create(session=session, thread_id=str(session.id))
    Step.objects.create(
        session=session,
        seq=seq,
        kind="system",
        payload={
            "event": "run_finished",
            "reason": "interrupt",
            "interrupts": [{"value": "may I the refund?"}],
        },
    )
    AgentSession.objects.filter(id=session.id).update(
        status=Status.WAITING_INPUT, last_seq=seq, step_count=seq
    )
    return session


@pytest.fixture
def sessions(db, done):
    """A session each action of the table succeeds on, by the names SUCCEEDS_ON uses."""
    waiting = run_inline(session_start(agent="approval", input="pay invoice 12"))
    paused = run_inline(session_start(agent="demo", input="what is 2**10, then save it"))
    checkpoint_rollback(session_id=paused.id, checkpoint_seq=paused.checkpoints.first().seq)
    held = run_inline(session_start(agent="demo", input="what is 3+3"))
    session_set_legal_hold(session_id=held.id, hold=True, note="case 7")
    graph = _graph_waiting_for_an_answer()
    found = {
        "done": done,
        "waiting": waiting,
        "paused": paused,
        "held": held,
        "graph": graph,
        "uncertain": _uncertain_notify_session(),
    }
    for session in found.values():
        session.refresh_from_db()
    return found


def _audit_count() -> int:
    return AuditEvent.objects.count()


# --- The table and the URLs -----------------------------------------------------------------


def test_every_action_has_one_url_taken_by_the_one_action_view():
    some_id = uuid.uuid4()
    for name in ACTIONS:
        url = reverse("sessions:action", args=[some_id, name])
        assert url == f"/sessions/{some_id}/actions/{name}/"
        match = resolve(url)
        assert match.func == views.session_action and match.kwargs["action"] == name
    for name in PREVIEWS:
        match = resolve(reverse("sessions:preview", args=[some_id, name]))
        assert match.func == views.action_preview and match.kwargs["action"] == name
    # A name the table does not hold has no URL at all.
    with pytest.raises(NoReverseMatch):
        reverse("sessions:action", args=[some_id, "no-such-action"])
    with pytest.raises(Resolver404):
        resolve(f"/sessions/{some_id}/actions/no-such-action/")
    with pytest.raises(Resolver404):
        resolve(f"/sessions/{some_id}/preview/cancel/")


def test_every_action_of_the_table_is_offered_by_a_template_and_no_other():
    source = "\n".join(
        path.read_text() for path in (Path(django_settings.BASE_DIR) / "templates").rglob("*.html")
    )
    posted = set(re.findall(r"url 'sessions:action' [\w.]+ '([\w-]+)'", source))
    previewed = set(re.findall(r"url 'sessions:preview' [\w.]+ '([\w-]+)'", source))
    # The preview's button posts its own action (preview.action).
    assert "url 'sessions:action' session.id preview.action" in source
    assert previewed == set(PREVIEWS)
    assert posted | previewed == set(ACTIONS)
    bulk = set(re.findall(r'name="action" value="([\w-]+)"', source))
    assert bulk == set(BULK_ACTIONS)


def test_every_policy_of_the_table_is_a_refusal_of_the_status_policy():
    for name, action in [*ACTIONS.items(), *BULK_ACTIONS.items()]:
        if action.policy is None:
            continue
        assert action.policy.endswith("_refusal"), name
        for status in Status.values:
            session = AgentSession(agent="demo", status=status)
            refusal = getattr(session, action.policy)()
            assert refusal is None or (isinstance(refusal, tuple) and len(refusal) == 2), name
            if isinstance(action, Action):
                assert action.refusal(session) == refusal, name


def test_the_samples_cover_every_field_and_every_action_has_a_session():
    for name, action in ACTIONS.items():
        assert set(action.fields) <= set(SAMPLE), name
    assert set(SUCCEEDS_ON) == set(ACTIONS)


# --- Who may take them ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ACTIONS)
def test_anonymous_is_sent_to_login_by_every_action(client, done, name):
    audited = _audit_count()
    response = client.post(reverse("sessions:action", args=[done.id, name]), form_of(name, done))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))
    assert _audit_count() == audited


@pytest.mark.parametrize("name", PREVIEWS)
def test_anonymous_is_sent_to_login_by_every_preview(client, done, name):
    response = client.get(reverse("sessions:preview", args=[done.id, name]), {"seq": 7})
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


@pytest.mark.parametrize("name", ACTIONS)
def test_a_viewer_is_refused_every_action(client, users, sessions, name):
    session = sessions[SUCCEEDS_ON[name]]
    audited = _audit_count()
    url = reverse("sessions:action", args=[session.id, name])
    client.force_login(users["viewer"])
    response = client.post(url, form_of(name, session), **HX)
    assert response.status_code == 403
    assert "only operators can change sessions" in response.content.decode()
    assert client.post(url, form_of(name, session)).status_code == 403  # without htmx too
    client.force_login(users["outsider"])
    assert client.post(url, form_of(name, session), **HX).status_code == 403
    assert _audit_count() == audited
    assert AgentSession.objects.get(id=session.id).step_count == session.step_count


@pytest.mark.parametrize("name", PREVIEWS)
def test_a_viewer_is_refused_every_preview(client, users, done, name):
    client.force_login(users["viewer"])
    response = client.get(reverse("sessions:preview", args=[done.id, name]), {"seq": 7}, **HX)
    assert response.status_code == 403
    assert "only operators can change sessions" in response.content.decode()


@pytest.mark.parametrize("name", BULK_ACTIONS)
def test_a_viewer_is_refused_every_bulk_action(client, users, sessions, name):
    form = {"action": name, "ids": [sessions["paused"].id], "confirm": "yes"}
    audited = _audit_count()
    assert client.post(reverse("sessions:bulk"), form).status_code == 302  # anonymous
    client.force_login(users["viewer"])
    response = client.post(reverse("sessions:bulk"), form, **HX)
    assert response.status_code == 403
    assert "only operators can change sessions" in response.content.decode()
    assert _audit_count() == audited


@pytest.mark.parametrize("name", ACTIONS)
def test_an_operator_takes_every_action(client, users, sessions, name):
    session = sessions[SUCCEEDS_ON[name]]
    audited = set(AuditEvent.objects.values_list("id", flat=True))
    client.force_login(users["operator"])
    response = client.post(
        reverse("sessions:action", args=[session.id, name]), form_of(name, session), **HX
    )
    assert response.status_code == 200, response.headers.get("X-Respawn-Error")
    if name == "fork":
        fork = AgentSession.objects.get(parent=session)
        assert response.headers["HX-Redirect"] == reverse("sessions:detail", args=[fork.id])
    else:
        # The panel, redrawn with what happened, and the trace told to redraw.
        assert 'id="panel"' in response.content.decode()
        assert "trace-changed" in response.headers["HX-Trigger-After-Swap"]
    event = AuditEvent.objects.exclude(id__in=audited).get(session=session)
    assert event.actor == users["operator"] and event.request_meta["via"] == "dashboard"


@pytest.mark.parametrize("name", PREVIEWS)
def test_an_operator_sees_every_preview(client, users, sessions, name):
    session = sessions[SUCCEEDS_ON[name]]
    client.force_login(users["operator"])
    response = client.get(reverse("sessions:preview", args=[session.id, name]), {"seq": 7}, **HX)
    assert response.status_code == 200
    body = response.content.decode()
    assert reverse("sessions:action", args=[session.id, name]) in body
    assert f"Confirm {name}" in body


@pytest.mark.parametrize("name", BULK_ACTIONS)
def test_an_operator_takes_every_bulk_action(client, users, sessions, name):
    session = sessions["paused"]
    client.force_login(users["operator"])
    form = {"action": name, "ids": [session.id]}
    asked = client.post(reverse("sessions:bulk"), form, **HX)
    assert asked.status_code == 200 and 'name="confirm" value="yes"' in asked.content.decode()
    response = client.post(reverse("sessions:bulk"), {**form, "confirm": "yes"}, **HX)
    assert response.status_code == 200
    assert "1 done, 0 refused" in response.content.decode()
    event = AuditEvent.objects.filter(session=session, action=name).latest("id")
    assert event.actor == users["operator"]


def test_an_unknown_bulk_action_is_refused_naming_it(client, users, done):
    client.force_login(users["operator"])
    response = client.post(reverse("sessions:bulk"), {"action": "delete", "ids": [done.id]}, **HX)
    assert response.status_code == 400
    assert "unknown bulk action &#x27;delete&#x27;" in response.content.decode()


# --- The page and its parts agree -----------------------------------------------------------------


def _same_render(html: str) -> str:
    """What differs between two renders of the same state: the CSRF token (masked anew
    each time), relative times and the wall time used so far, and the notices one of
    them carried."""
    html = re.sub(r'name="csrfmiddlewaretoken" value="[^"]*"', 'name="csrfmiddlewaretoken"', html)
    html = re.sub(r"<time [^>]*>[^<]*</time>", "<time>", html)
    html = re.sub(r'<span class="budget[^"]*" data-budget="time".*?</span>', "<time>", html)
    html = re.sub(r'<ul class="messages">.*?</ul>', "", html, flags=re.S)
    return re.sub(r"\s+", " ", html).strip()


def _cut(page: str, start: str, end: str) -> str:
    """The page from `start` to the first `end` after it (`end` kept if it is a closing
    tag, dropped if it is the next element's opening)."""
    first = page.index(start)
    last = page.index(end, first)
    return page[first : last + len(end)] if end.startswith("</") else page[first:last]


def _parts_of_page(client, session: AgentSession) -> dict[str, str]:
    page = client.get(reverse("sessions:detail", args=[session.id])).content.decode()
    return {
        "panel": _cut(page, '<div id="panel">', '<nav class="page-nav"'),
        "header": _cut(page, '<section id="header"', "</section>"),
        "actions": _cut(page, '<section id="actions"', "</section>"),
        "trace": _cut(page, '<section id="trace"', "</section>"),
    }


def _parts_redrawn(client, session: AgentSession) -> dict[str, str]:
    panel = reverse("sessions:panel", args=[session.id])
    parts = {
        part: client.get(panel, {"part": part}, **HX) for part in ("panel", "header", "actions")
    }
    parts["trace"] = client.get(
        reverse("sessions:detail", args=[session.id]), **HX, HTTP_HX_TARGET="trace"
    )
    return {part: response.content.decode() for part, response in parts.items()}


@pytest.mark.parametrize("role", ["operator", "viewer"])
def test_every_part_redrawn_on_its_own_is_the_part_of_the_page(client, users, sessions, role):
    client.force_login(users[role])
    for name, session in sessions.items():
        page, redrawn = _parts_of_page(client, session), _parts_redrawn(client, session)
        for part in page:
            assert _same_render(redrawn[part]) == _same_render(page[part]), (name, part)


@pytest.mark.parametrize("name", ["reject", "rollback", "budgets", "hold"])
def test_the_panel_redrawn_after_an_action_is_the_panel_of_the_page(client, users, sessions, name):
    session = sessions[SUCCEEDS_ON[name]]
    client.force_login(users["operator"])
    response = client.post(
        reverse("sessions:action", args=[session.id, name]), form_of(name, session), **HX
    )
    assert response.status_code == 200
    after = response.content.decode()
    assert 'class="messages"' in after  # the outcome, said in the panel
    page = _parts_of_page(client, session)
    assert _same_render(after) == _same_render(page["panel"])
    # The trace it tells to redraw comes back as the page shows it now.
    redrawn = _parts_redrawn(client, session)
    assert _same_render(redrawn["trace"]) == _same_render(page["trace"])
