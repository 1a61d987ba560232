"""The work queue (sessions_app.services.workqueue): a session's owner and people's notes,
from the services, the dashboard and the API; the lists' owner filters; Needs attention's
waiting time against each section's target, and the selector of items past it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.urls import reverse

from sessions_app.checks import check_attention_targets
from sessions_app.models import AgentSession, AuditEvent, SessionNote, Status
from sessions_app.models.clock import database_clock
from sessions_app.selectors import core as selectors
from sessions_app.services.core import ActionError, session_start
from sessions_app.services.workqueue import session_add_note, session_hand, session_take
from sessions_app.store import writes

from ..conftest import run_inline

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def bob(users):
    """A second operator."""
    user = User.objects.create_user("bob", password="pw-bob")
    user.groups.add(Group.objects.get(name="operator"))
    return user


@pytest.fixture
def session(db):
    return run_inline(session_start(agent="demo", input="what is 2+2"))


def _api(client, user, method: str, path: str, body: dict | None = None):
    from sessions_app.models import ApiToken

    _, raw = ApiToken.issue(user)
    call = getattr(client, method)
    # A POST without a body is sent bare, as curl does (no form content type).
    kwargs: dict = {"content_type": "application/json"}
    if body is not None:
        kwargs["data"] = body
    return call(f"/api{path}", HTTP_AUTHORIZATION=f"Bearer {raw}", **kwargs)


# --- The services ---------------------------------------------------------------------------


def test_taking_an_unassigned_session_makes_it_yours_and_is_audited(users, session):
    before = session.updated_at
    taken = session_take(session_id=session.id, seen_owner="", actor=users["operator"])
    assert taken.owner == users["operator"] and taken.owned_since is not None
    session.refresh_from_db()
    assert session.owner_id == users["operator"].pk
    # Ownership is not activity: the list's order and the waiting time stay.
    assert session.updated_at == before
    event = AuditEvent.objects.get(session=session, action="take")
    assert event.actor == users["operator"]
    assert event.before["owner"] is None and event.after["owner"] == "olivia"


def test_a_stale_take_never_steals_a_session_someone_took_meanwhile(users, bob, session):
    session_take(session_id=session.id, seen_owner="", actor=bob)
    # Olivia's form still shows it unassigned.
    with pytest.raises(ActionError) as refused:
        session_take(session_id=session.id, seen_owner="", actor=users["operator"])
    assert refused.value.code == "owner_changed" and refused.value.status == 409
    assert "you saw this session unassigned, bob owns it now" in str(refused.value)
    session.refresh_from_db()
    assert session.owner == bob
    assert not AuditEvent.objects.filter(session=session, action="take_over").exists()


def test_taking_over_needs_the_owner_one_saw_and_is_audited_as_a_take_over(users, bob, session):
    session_take(session_id=session.id, actor=bob)
    taken = session_take(session_id=session.id, seen_owner="bob", actor=users["operator"])
    assert taken.owner == users["operator"]
    event = AuditEvent.objects.get(session=session, action="take_over")
    assert event.before["owner"] == "bob" and event.after["owner"] == "olivia"


def test_taking_ones_own_session_changes_nothing(users, session):
    session_take(session_id=session.id, actor=users["operator"])
    session_take(session_id=session.id, seen_owner="someone", actor=users["operator"])
    assert AuditEvent.objects.filter(session=session, action__startswith="take").count() == 1


def test_handing_on_and_putting_back_are_audited_as_the_assignment_history(users, bob, session):
    session_take(session_id=session.id, actor=users["operator"])
    session_hand(session_id=session.id, to="bob", seen_owner="olivia", actor=users["operator"])
    session.refresh_from_db()
    assert session.owner == bob
    session_hand(session_id=session.id, to="", seen_owner="bob", actor=bob)
    session.refresh_from_db()
    assert session.owner is None and session.owned_since is None
    history = list(
        AuditEvent.objects.filter(session=session, action__in=["take", "hand", "unassign"])
        .order_by("id")
        .values_list("action", "actor_label", "after__owner")
    )
    assert history == [
        ("take", "olivia", "olivia"),
        ("hand", "olivia", "bob"),
        ("unassign", "bob", None),
    ]


def test_a_session_is_handed_only_to_an_operator_who_exists(users, session):
    with pytest.raises(ActionError, match="no user named 'nobody'") as unknown:
        session_hand(session_id=session.id, to="nobody", actor=users["operator"])
    assert unknown.value.field == "to" and unknown.value.status == 404
    with pytest.raises(ActionError, match="victor cannot act on sessions"):
        session_hand(session_id=session.id, to="victor", actor=users["operator"])
    session.refresh_from_db()
    assert session.owner is None


def test_a_stale_hand_is_refused(users, bob, session):
    session_take(session_id=session.id, actor=bob)
    with pytest.raises(ActionError, match="the owner changed") as refused:
        session_hand(session_id=session.id, to="olivia", seen_owner="", actor=users["operator"])
    assert refused.value.code == "owner_changed"
    session.refresh_from_db()
    assert session.owner == bob


def test_a_note_is_kept_as_plain_text_at_the_step_the_session_reached(users, session):
    text = "<b>checked</b> with **finance**\nticket #12"
    note = session_add_note(session_id=session.id, text=f"  {text}  ", actor=users["operator"])
    assert note.text == text and note.seq == session.last_seq
    assert note.author == users["operator"] and note.author_label == "olivia"
    event = AuditEvent.objects.get(session=session, action="note")
    assert event.after == {"note": note.pk, "seq": session.last_seq, "text": text}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "the note is empty"),
        ("   ", "the note is empty"),
        ("x" * 2001, "the note is 2,001 characters long; at most 2,000"),
        ("bell\x07", "control character"),
    ],
)
def test_a_bad_note_is_refused_naming_the_problem(users, session, text, problem):
    with pytest.raises(ActionError, match=problem):
        session_add_note(session_id=session.id, text=text, actor=users["operator"])
    assert not SessionNote.objects.exists()
    assert not AuditEvent.objects.filter(action="note").exists()


def test_no_one_but_an_operator_changes_the_queue(users, session):
    for actor in (users["viewer"], users["outsider"], None):
        for act in (
            lambda a: session_take(session_id=session.id, actor=a),
            lambda a: session_hand(session_id=session.id, to="olivia", actor=a),
            lambda a: session_add_note(session_id=session.id, text="hi", actor=a),
        ):
            with pytest.raises(ActionError) as refused:
                act(actor)
            assert refused.value.status == 403
    assert not AuditEvent.objects.filter(action__in=["take", "hand", "note"]).exists()


def test_retention_deletes_a_sessions_notes_with_it(users, session):
    session_add_note(session_id=session.id, text="looked", actor=users["operator"])
    writes.delete_trace([session.id])
    assert not SessionNote.objects.filter(session_id=session.id).exists()


# --- The dashboard ----------------------------------------------------------------------------


def test_everyone_sees_who_took_the_session(client, users, bob, session):
    client.force_login(users["operator"])
    response = client.post(
        reverse("sessions:action", args=[session.id, "take"]), {"seen_owner": ""}, **HX
    )
    assert response.status_code == 200
    assert "Taken: it is yours" in response.content.decode()
    for who in (users["viewer"], bob):
        client.force_login(who)
        page = client.get(reverse("sessions:detail", args=[session.id])).content.decode()
        assert 'id="owner-badge">owned by olivia</span>' in page
    # Bob, not the owner, is asked before any action, and told who owns it.
    assert "Owned by olivia since" in page
    assert 'hx-confirm="Owned by olivia since' in page
    assert "Take over from olivia" in page
    # The viewer sees the owner but is offered nothing.
    client.force_login(users["viewer"])
    page = client.get(reverse("sessions:detail", args=[session.id])).content.decode()
    assert "Take over" not in page and "Leave the note" not in page


def test_a_stale_take_on_the_page_is_refused_with_who_owns_it(client, users, bob, session):
    session_take(session_id=session.id, actor=bob)
    client.force_login(users["operator"])
    response = client.post(
        reverse("sessions:action", args=[session.id, "take"]), {"seen_owner": ""}, **HX
    )
    assert response.status_code == 409
    assert "bob owns it now" in response.content.decode()
    session.refresh_from_db()
    assert session.owner == bob


def test_notes_show_escaped_in_the_margin_beside_their_step(client, users, session):
    client.force_login(users["operator"])
    text = "<script>alert(1)</script> **not bold**"
    response = client.post(
        reverse("sessions:action", args=[session.id, "note"]), {"note": text}, **HX
    )
    assert response.status_code == 200
    assert "trace-changed" in response.headers["HX-Trigger-After-Swap"]
    client.force_login(users["viewer"])
    page = client.get(reverse("sessions:detail", args=[session.id])).content.decode()
    step = page[page.index(f'id="step-{session.last_seq}"') :]
    step = step[: step.index("</li>")]
    assert 'class="margin-notes"' in step
    assert "&lt;script&gt;alert(1)&lt;/script&gt; **not bold**" in step
    assert "<script>alert(1)" not in page


def test_a_note_written_before_a_filtered_page_goes_beside_the_first_step_shown(
    client, users, session
):
    note = SessionNote.objects.create(
        session=session, author=users["operator"], author_label="olivia", text="early", seq=0
    )
    client.force_login(users["viewer"])
    page = client.get(reverse("sessions:detail", args=[session.id])).content.decode()
    assert f'id="note-{note.pk}"' in page and "written at step #0" in page


def test_the_operators_suggested_for_a_hand_are_operators_only(client, users, bob, session):
    url = reverse("sessions:operators", args=[session.id])
    client.force_login(users["operator"])
    body = client.get(url, **HX).content.decode()
    assert '<option value="bob">' in body and '<option value="olivia">' in body
    assert "victor" not in body and "oscar" not in body
    client.force_login(users["outsider"])
    assert client.get(url, **HX).status_code == 403


def test_the_list_filters_by_owner(client, users, bob):
    mine = session_start(agent="demo", input="a", title="mine")
    bobs = session_start(agent="demo", input="b", title="bobs")
    session_start(agent="demo", input="c", title="nobodys")
    session_take(session_id=mine.id, actor=users["operator"])
    session_take(session_id=bobs.id, actor=bob)
    client.force_login(users["operator"])

    def listed(owner: str) -> set[str]:
        response = client.get(reverse("sessions:list"), {"owner": owner} if owner else {})
        return {s.title for s in response.context["sessions"]}

    assert listed("me") == {"mine"}
    assert listed("bob") == {"bobs"}
    assert listed("unassigned") == {"nobodys"}
    assert listed("") == {"mine", "bobs", "nobodys"}
    page = client.get(reverse("sessions:list"), {"owner": "ghost"}).content.decode()
    assert "unknown owner &#x27;ghost&#x27;" in page
    # "mine" is each person's own (the counts' cache is not shared between them).
    client.force_login(bob)
    assert listed("me") == {"bobs"}
    body = client.get(reverse("sessions:list")).content.decode()
    assert "owned by olivia" in body and "owned by bob" in body


def test_the_list_shows_owners_without_a_query_per_row(
    client, users, django_assert_max_num_queries
):
    for i in range(30):
        s = AgentSession.objects.create(agent="demo", title=f"s{i}")
        session_take(session_id=s.id, actor=users["operator"])
    client.force_login(users["operator"])
    with django_assert_max_num_queries(6):
        body = client.get(reverse("sessions:list")).content.decode()
    assert body.count("owned by olivia") == 30


# --- Needs attention: owners, waiting time and targets ------------------------------------------


def _stuck(title: str, *, hours: float) -> AgentSession:
    """A queued session no worker took, its last activity `hours` ago."""
    session = session_start(agent="demo", input="x", title=title)
    ago = database_clock() - timedelta(hours=hours)
    AgentSession.objects.filter(id=session.id).update(
        status=Status.QUEUED, updated_at=ago, dispatched_at=ago
    )
    return session


def test_attention_shows_the_wait_against_the_target_and_filters_by_owner(
    client, users, bob, settings
):
    settings.RESPAWN_ATTENTION_TARGETS = {"stuck": 3600}
    late = _stuck("late", hours=3)
    fresh = _stuck("fresh", hours=0.2)
    session_take(session_id=late.id, actor=bob)
    client.force_login(users["operator"])
    response = client.get(reverse("sessions:attention"))
    stuck = next(s for s in response.context["sections"] if s.key == "stuck")
    waits = {w.session.title: w for w in stuck.waits}
    assert waits["late"].past_target and not waits["fresh"].past_target
    assert stuck.target == 3600
    body = response.content.decode()
    assert f'class="past-target" data-session="{late.id}"' in body
    assert "past target" in body and "<b>bob</b>" in body
    # Taken from the queue here: an unassigned row offers "take" to an operator.
    assert reverse("sessions:action", args=[fresh.id, "take"]) in body
    assert reverse("sessions:action", args=[late.id, "take"]) not in body

    def titles(owner: str) -> set[str]:
        r = client.get(reverse("sessions:attention"), {"owner": owner})
        return {
            w.session.title
            for w in next(s for s in r.context["sections"] if s.key == "stuck").waits
        }

    assert titles("unassigned") == {"fresh"}
    assert titles("bob") == {"late"}
    assert titles("me") == set()
    bad = client.get(reverse("sessions:attention"), {"owner": "ghost"})
    assert bad.status_code == 200 and "unknown owner" in bad.content.decode()


def test_past_target_lists_the_items_waiting_past_their_target(users, bob, settings):
    settings.RESPAWN_ATTENTION_TARGETS = {"stuck": 3600}
    late = _stuck("late", hours=3)
    _stuck("fresh", hours=0.2)
    session_take(session_id=late.id, actor=bob)
    found = [w for w in selectors.past_target() if w.key == "stuck"]
    assert [w.session.id for w in found] == [late.id]
    (item,) = found
    assert item.past_target and item.target == 3600
    assert timedelta(hours=1, minutes=55) < item.over < timedelta(hours=2, minutes=5)
    assert item.session.owner.username == "bob"  # loaded with it


def test_past_target_reads_owners_without_a_query_per_item(
    users, settings, django_assert_max_num_queries
):
    settings.RESPAWN_ATTENTION_TARGETS = {"stuck": 60}
    for i in range(10):
        s = _stuck(f"s{i}", hours=2)
        session_take(session_id=s.id, actor=users["operator"])
    with django_assert_max_num_queries(len(selectors.ATTENTION_SECTIONS) + 1):
        found = selectors.past_target()
        assert {w.session.owner.username for w in found if w.key == "stuck"} == {"olivia"}


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("{not json", "not JSON"),
        ([600], "expected a JSON object of section: seconds, got list"),
        ({"stcuk": 600}, "unknown section 'stcuk'"),
        ({"stuck": 0}, "stuck: expected a number of seconds above 0"),
        ({"stuck": "10m"}, "stuck: expected a number of seconds above 0"),
        ({"stuck": True}, "stuck: expected a number of seconds above 0"),
    ],
)
def test_bad_attention_targets_stop_the_start_naming_the_problem(settings, value, problem):
    settings.RESPAWN_ATTENTION_TARGETS = value
    (error,) = check_attention_targets()
    assert error.id == "respawn.E032" and problem in error.msg
    assert error.msg.startswith("RESPAWN_ATTENTION_TARGETS: ")
    with pytest.raises(SystemCheckError, match="RESPAWN_ATTENTION_TARGETS"):
        call_command("check")


def test_attention_targets_keep_their_defaults_for_sections_not_named(settings):
    settings.RESPAWN_ATTENTION_TARGETS = {"stuck": 120}
    assert check_attention_targets() == []
    targets = selectors.attention_targets()
    assert targets["stuck"] == 120
    assert targets["approvals"] == selectors.ATTENTION_TARGETS["approvals"]
    assert set(targets) == set(selectors.ATTENTION_SECTIONS)


# --- The API ------------------------------------------------------------------------------------


def test_the_api_takes_hands_and_reports_the_owner(client, users, bob, session):
    taken = _api(client, users["operator"], "post", f"/sessions/{session.id}/take", {})
    assert taken.status_code == 200
    assert taken.json()["owner"] == "olivia" and taken.json()["owned_since"]
    # Bob's stale view (unassigned) is refused, naming the owner.
    refused = _api(client, bob, "post", f"/sessions/{session.id}/take")
    assert refused.status_code == 409
    assert refused.json()["error"] == "owner_changed"
    assert "olivia owns it now" in refused.json()["detail"]
    over = _api(client, bob, "post", f"/sessions/{session.id}/take", {"seen_owner": "olivia"})
    assert over.status_code == 200 and over.json()["owner"] == "bob"
    handed = _api(
        client, bob, "post", f"/sessions/{session.id}/hand", {"to": "olivia", "seen_owner": "bob"}
    )
    assert handed.status_code == 200 and handed.json()["owner"] == "olivia"
    detail = _api(client, users["viewer"], "get", f"/sessions/{session.id}")
    assert detail.json()["owner"] == "olivia"
    back = _api(
        client,
        users["operator"],
        "post",
        f"/sessions/{session.id}/hand",
        {"to": None, "seen_owner": "olivia"},
    )
    assert back.status_code == 200 and back.json()["owner"] is None
    unknown = _api(client, bob, "post", f"/sessions/{session.id}/hand", {"to": "ghost"})
    assert unknown.status_code == 404 and "no user named 'ghost'" in unknown.json()["detail"]
    actions = list(
        AuditEvent.objects.filter(session=session).order_by("id").values_list("action", flat=True)
    )
    assert actions[-4:] == ["take", "take_over", "hand", "unassign"]


def test_the_api_lists_by_owner(client, users, bob):
    mine = session_start(agent="demo", input="a")
    bobs = session_start(agent="demo", input="b")
    free = session_start(agent="demo", input="c")
    session_take(session_id=mine.id, actor=users["operator"])
    session_take(session_id=bobs.id, actor=bob)

    def ids(query: str) -> set[str]:
        response = _api(client, users["operator"], "get", f"/sessions?{query}")
        assert response.status_code == 200, response.json()
        return {item["id"] for item in response.json()["items"]}

    assert ids("owner=me") == {str(mine.id)}
    assert ids("owner=bob") == {str(bobs.id)}
    assert ids("owner=unassigned") == {str(free.id)}
    listed = _api(client, users["viewer"], "get", "/sessions").json()["items"]
    assert {i["id"]: i["owner"] for i in listed}[str(bobs.id)] == "bob"
    # A username is a filter, as an agent's name is: one no user has matches nothing.
    assert ids("owner=ghost") == set()


def test_the_api_notes(client, users, session):
    added = _api(client, users["operator"], "post", f"/sessions/{session.id}/notes", {"text": "hi"})
    assert added.status_code == 201
    assert added.json()["author"] == "olivia" and added.json()["seq"] == session.last_seq
    listed = _api(client, users["viewer"], "get", f"/sessions/{session.id}/notes")
    assert [n["text"] for n in listed.json()] == ["hi"]
    too_long = _api(
        client, users["operator"], "post", f"/sessions/{session.id}/notes", {"text": "x" * 2001}
    )
    assert too_long.status_code in (400, 422)
    blank = _api(client, users["operator"], "post", f"/sessions/{session.id}/notes", {"text": " "})
    assert blank.status_code in (400, 422)
    assert SessionNote.objects.count() == 1


def test_a_viewer_is_refused_every_work_queue_change_through_the_api(client, users, session):
    for path, body in (
        ("take", {}),
        ("hand", {"to": "olivia"}),
        ("notes", {"text": "hi"}),
    ):
        response = _api(client, users["viewer"], "post", f"/sessions/{session.id}/{path}", body)
        assert response.status_code == 403, path
    session.refresh_from_db()
    assert session.owner is None and not SessionNote.objects.exists()
