"""The work queue in a real browser: operator A takes a session; operator B, opening it,
sees that A owns it (and is asked before acting on it), and leaves a note; A sees the note
in the trace's margin beside the step the session had reached."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User

from sessions_app.models import AuditEvent, SessionNote
from sessions_app.services.core import session_start
from tests.conftest import run_inline

from .conftest import console_errors, login, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.parametrize("width", [390, 1400])
def test_one_operator_takes_a_session_and_another_sees_it_and_leaves_a_note(
    make_page, users, width
):
    bob = User.objects.create_user("bob", password="pw-bob")
    bob.groups.add(Group.objects.get(name="operator"))
    session = run_inline(session_start(agent="demo", input="what is 2+2"))
    last = session.last_seq

    a = make_page(width, 900, accept_dialogs=True)
    login(a, "olivia", "pw-operator")
    a.goto(f"/sessions/{session.id}/")
    assert a.locator("#owner-badge").inner_text() == "unassigned"
    a.click("#take")
    a.locator("#owner-badge").filter(has_text="owned by olivia (you)").wait_for(timeout=10_000)
    assert "olivia" in a.locator("#owner").inner_text()

    b = make_page(width, 900, accept_dialogs=True)
    login(b, "bob", "pw-bob")
    b.goto(f"/sessions/{session.id}/")
    # B sees who owns it before acting: in the header, and above the actions.
    assert b.locator("#owner-badge").inner_text() == "owned by olivia"
    warning = b.locator("#ownership .owner-warning")
    assert warning.is_visible() and "Owned by olivia" in warning.inner_text()
    assert b.locator("#take").inner_text() == "Take over from olivia"
    # Every action B takes asks first, naming the owner (the dialog's text).
    questions: list[str] = []
    b.on("dialog", lambda dialog: questions.append(dialog.message))
    note = "Called the customer <b>back</b>; waiting for finance **before** approving."
    b.fill("#note-form textarea[name=note]", note)
    b.click("#note-form button[type=submit]")
    b.locator(".margin-note").filter(has_text="Called the customer").wait_for(timeout=10_000)
    assert not questions  # a note changes nothing of the run: no question
    screenshot(b, f"work-queue-b-{width}")

    # A opens the page again: the note is in the margin beside the step it was written at.
    a.goto(f"/sessions/{session.id}/")
    margin = a.locator(f"#step-{last} .margin-notes")
    margin.wait_for(timeout=10_000)
    text = margin.locator(".note-text").inner_text()
    assert text == note  # as written: never rendered as markup
    assert margin.locator("b").filter(has_text="back").count() == 0
    assert "bob" in margin.inner_text()
    screenshot(a, f"work-queue-a-{width}")

    assert SessionNote.objects.get(session=session).author == bob
    assert AuditEvent.objects.filter(session=session, action="take").count() == 1
    assert AuditEvent.objects.filter(session=session, action="note").count() == 1
    assert console_errors(a) == [] and console_errors(b) == []


def test_a_stale_take_in_the_browser_is_refused_with_who_owns_it_now(make_page, users):
    bob = User.objects.create_user("bob", password="pw-bob")
    bob.groups.add(Group.objects.get(name="operator"))
    session = run_inline(session_start(agent="demo", input="what is 3+3"))
    b = make_page(1300, 900, accept_dialogs=True)
    login(b, "bob", "pw-bob")
    b.goto(f"/sessions/{session.id}/")
    b.evaluate("window.__noReload = true")
    # Olivia takes it while Bob's page still shows it unassigned.
    from sessions_app.services.workqueue import session_take

    session_take(session_id=session.id, actor=users["operator"])
    b.click("#take")
    toast = b.locator("#toast")
    toast.wait_for(state="visible", timeout=5000)
    assert "olivia owns it now" in toast.inner_text()
    session.refresh_from_db()
    assert session.owner == users["operator"]
    assert console_errors(b, allow_http_errors=True) == []


def test_a_team_operator_hands_a_session_to_someone_the_form_offers(make_page, users):
    """The hand form's suggestions are the people who may act on this session: its team's
    operators and team admins and the global operators, not another team's; handing it to
    one of them through the form makes it theirs."""
    from sessions_app.models import AgentSession, Membership, Team, TeamAgent

    support = Team.objects.create(name="Support", slug="support")
    billing = Team.objects.create(name="Billing", slug="billing")
    TeamAgent.objects.create(team=support, agent="demo")
    TeamAgent.objects.create(team=billing, agent="approval")
    for team, role in ((support, "operator"), (support, "team_admin"), (billing, "operator")):
        user = User.objects.create_user(f"{team.slug}-{role}", password="pw")
        Membership.objects.create(user=user, team=team, role=role)
    session = run_inline(session_start(agent="demo", input="what is 2+2"))

    page = make_page(1300, 900)
    login(page, "support-operator", "pw")
    page.goto(f"/sessions/{session.id}/")
    page.click("#hand summary")
    options = page.locator("datalist#operators option")
    options.first.wait_for(state="attached", timeout=10_000)
    offered = set(options.evaluate_all("els => els.map(e => e.value)"))
    assert offered == {"support-operator", "support-team_admin", "olivia"}
    # The suggestions went into the list, not over the panel that holds the form.
    assert page.locator("#hand input[name=to]").is_visible()
    page.fill("#hand input[name=to]", "support-team_admin")
    page.click("#hand button[type=submit]")
    page.locator("#owner-badge").filter(has_text="owned by support-team_admin").wait_for(
        timeout=10_000
    )
    assert AgentSession.objects.get(pk=session.pk).owner.username == "support-team_admin"
    assert console_errors(page) == []
