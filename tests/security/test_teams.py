"""Teams: two teams, each with its agent, an operator and a viewer. Every URL of the
dashboard and every operation of the API is tried with the other team's session id: each is
a 404 (never a 403 that confirms the id) and changes nothing; no page lists, counts or
charts the other team's session; team tokens act within their team and role, expire and
are revoked by the team's admins, audited.

The URL lists come from the URL resolver and the OpenAPI document, as in
test_permission_matrix, so a view added later is tried here without being told."""

from __future__ import annotations

import io
import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.urls import get_resolver
from django.utils import timezone

from sessions_app.dashboard.actions import ACTIONS, PREVIEWS
from sessions_app.models import (
    AgentSession,
    ApiToken,
    AuditEvent,
    Membership,
    SessionNote,
    Status,
    Step,
    Team,
    TeamAgent,
)
from sessions_app.permissions import session_scope
from sessions_app.services.core import ActionError, session_start
from sessions_app.services.teams import team_token_issue, team_token_revoke, teams_sync
from sessions_app.upkeep.transfer import export_bytes, import_session

from ..conftest import run_inline
from .test_permission_matrix import api_operations, walk

pytestmark = pytest.mark.django_db

SECRET_TITLE = "billing-only-title"


@pytest.fixture
def teams(users):
    support = Team.objects.create(name="Support", slug="support")
    billing = Team.objects.create(name="Billing", slug="billing")
    TeamAgent.objects.create(team=support, agent="demo")
    TeamAgent.objects.create(team=billing, agent="approval")
    people = {}
    for team in (support, billing):
        for role in ("operator", "viewer", "team_admin"):
            user = User.objects.create_user(f"{team.slug}-{role}", password="pw")
            Membership.objects.create(user=user, team=team, role=role)
            people[f"{team.slug}_{role}"] = user
    ours = run_inline(session_start(agent="demo", input="what is (12*7)+3, then save it as a note"))
    # Waiting for a person's approval: most actions would change it, if they were let.
    theirs = run_inline(session_start(agent="approval", input="pay invoice 3", title=SECRET_TITLE))
    assert theirs.status == Status.WAITING_INPUT
    return {"support": support, "billing": billing, "ours": ours, "theirs": theirs, **people}


def snapshot(session: AgentSession) -> tuple:
    row = AgentSession.objects.get(pk=session.pk)
    return (
        row.status,
        row.head,
        row.last_seq,
        row.fencing_token,
        row.owner_id,
        row.title,
        row.legal_hold,
        row.updated_at,
        Step.objects.filter(session=session).count(),
        AuditEvent.objects.filter(session=session).count(),
        SessionNote.objects.filter(session=session).count(),
        AgentSession.objects.filter(parent=session).count(),
        AgentSession.objects.count(),
    )


def session_urls(session_id) -> list[str]:
    """Every dashboard URL that names a session, for `session_id`."""
    urls = []
    for route, _pattern in walk(get_resolver().url_patterns):
        if "<uuid:session_id>" not in route or route.startswith(("admin/", "api/")):
            continue
        url = "/" + route.replace("<uuid:session_id>", str(session_id))
        for parameter, names in (("<action:action>", ACTIONS), ("<previewed:action>", PREVIEWS)):
            if parameter in url:
                urls.extend(url.replace(parameter, name) for name in names)
                break
        else:
            urls.append(url)
    assert not [u for u in urls if "<" in u], "an unclassified URL parameter"
    return urls


FORM = {
    "checkpoint_seq": 3,
    "content": "hi",
    "text": "x",
    "to": "support-operator",
    "value": "yes",
    "reason": "r",
    "resolution": "rerun",
    "title": "renamed",
    "hold": "1",
}


def test_another_teams_session_is_not_found_on_every_dashboard_url(client, teams):
    theirs, ours = teams["theirs"], teams["ours"]
    before = snapshot(theirs)
    urls = session_urls(theirs.id)
    assert len(urls) > 20
    for who in ("support_operator", "support_viewer", "support_team_admin"):
        client.force_login(teams[who])
        for url in urls:
            for method in ("get", "post"):
                response = getattr(client, method)(url, FORM)
                if response.status_code == 405:
                    continue
                if url.endswith("/row/"):
                    # The list's polled row: a session gone from sight is drawn as gone.
                    assert response.status_code == 286, (url, who)
                else:
                    assert response.status_code == 404, (method, url, who, response.status_code)
                assert SECRET_TITLE not in response.content.decode(errors="replace"), url
        # In bulk: the other team's id is not a selection.
        response = client.post(
            "/sessions/bulk/", {"action": "cancel", "ids": [str(theirs.id)], "confirm": "yes"}
        )
        assert response.status_code == (403 if who == "support_viewer" else 400)
    assert snapshot(theirs) == before
    # The same URLs reach the team's own session (the test is not passing for nothing).
    client.force_login(teams["support_operator"])
    assert client.get(f"/sessions/{ours.id}/").status_code == 200
    assert client.get(f"/sessions/{ours.id}/timeline/").status_code == 200
    assert client.post(f"/sessions/{ours.id}/actions/take/", {}).status_code in (200, 302)
    assert AgentSession.objects.get(pk=ours.pk).owner == teams["support_operator"]


def dashboard_pages() -> list[str]:
    pages = []
    for route, _pattern in walk(get_resolver().url_patterns):
        if route.startswith(("admin/", "api/", "static/")) or "<" in route:
            continue
        pages.append("/" + route)
    return pages


def test_no_dashboard_page_shows_another_teams_session(client, teams):
    theirs, ours = teams["theirs"], teams["ours"]
    client.force_login(teams["support_operator"])
    shown = 0
    pages = dashboard_pages() + [
        f"/sessions/?q={theirs.id}",
        f"/sessions/?q={SECRET_TITLE}",
        "/sessions/?q=invoice",
        "/sessions/?agent=approval",
        "/sessions/?status=waiting_input",
        "/sessions/counts/?fresh=1",
        "/sessions/charts/?span=7d",
        "/sessions/attention/?section=approvals",
        "/sessions/costs/?group=agent",
        f"/audit/?session={theirs.id}",
        f"/audit/?session={str(theirs.id)[:8]}",
    ]
    for url in pages:
        response = client.get(url, HTTP_HX_REQUEST="true" if "section=" in url else "")
        body = response.content.decode(errors="replace")
        assert f"/sessions/{theirs.id}/" not in body, url  # no link to it
        if str(theirs.id)[:8] not in url:  # (a search for it shows what was searched)
            assert str(theirs.id)[:8] not in body, url
        if SECRET_TITLE not in url:
            assert SECRET_TITLE not in body, url
        assert "send_payment" not in body and "pay invoice" not in body, url
        shown += response.status_code == 200
    assert shown > 10
    listed = client.get("/sessions/").content.decode()
    assert str(ours.id) in listed  # their own session is there
    assert 'value="approval"' not in listed  # the agent filter offers their agents only
    counts = client.get("/sessions/counts/?fresh=1").content.decode()
    assert "waiting for a person <b>0</b>" in counts and ">of 1<" in counts
    agents = client.get("/sessions/agents/").content.decode()
    assert "send_payment" not in agents and "demo" in agents
    # Metrics count every team's sessions: for global roles. (Alert rules are narrowed to
    # the team: test_alert_rules_are_narrowed_to_the_teams_agents.)
    assert client.get("/metrics").status_code == 403


def test_the_list_counts_only_the_teams_sessions(teams):
    from sessions_app.selectors.core import SessionFilters, status_totals

    support = SessionFilters(scope=session_scope(teams["support_viewer"]))
    billing = SessionFilters(scope=session_scope(teams["billing_viewer"]))
    everyone = SessionFilters()  # no reader: every session (the workers, the commands)
    assert status_totals(support, fresh=True).total == 1
    assert status_totals(billing, fresh=True).of(Status.WAITING_INPUT) == 1
    assert status_totals(billing, fresh=True).total == 1
    assert status_totals(everyone, fresh=True).total == 2


def bearer(user, **fields) -> str:
    token, raw = ApiToken.issue(user)
    for name, value in fields.items():
        setattr(token, name, value)
    token.save()
    return f"Bearer {raw}"


API_BODY = {
    "checkpoint_seq": 3,
    "content": "hi",
    "agent": "demo",
    "input": "hi",
    "resolution": "rerun",
    "hold": True,
    "note": "case 1",
    "value": "yes",
    "to": "support-operator",
    "text": "a note",
}


def test_another_teams_session_is_not_found_on_every_api_operation(client, teams):
    theirs = teams["theirs"]
    before = snapshot(theirs)
    tokens = {
        "operator": bearer(teams["support_operator"]),
        "viewer": bearer(teams["support_viewer"]),
        "team token": bearer(teams["support_team_admin"], team=teams["support"], role="operator"),
    }
    tried = 0
    for method, path in api_operations(client):
        if "{session_id}" not in path:
            continue
        url = path.replace("{session_id}", str(theirs.id))
        for who, header in tokens.items():
            if method == "GET":
                response = client.get(url, HTTP_AUTHORIZATION=header)
            else:
                body = {"max_steps": 500} if path.endswith("/budgets") else API_BODY
                response = client.post(
                    url, body, content_type="application/json", HTTP_AUTHORIZATION=header
                )
            code = response.status_code
            if who == "viewer" and method == "POST" and not path.endswith("/export"):
                assert code == 403, (method, url, who, code)  # refused before any lookup
            else:
                assert code == 404, (method, url, who, code, response.content[:200])
            assert SECRET_TITLE not in response.content.decode(errors="replace")
            tried += 1
    assert tried > 40
    assert snapshot(theirs) == before


def test_the_api_lists_and_starts_only_the_teams_agents(client, teams):
    header = bearer(teams["support_operator"])
    listed = client.get("/api/sessions", HTTP_AUTHORIZATION=header).json()["items"]
    assert {s["agent"] for s in listed} == {"demo"}
    assert client.get("/api/sessions?agent=approval", HTTP_AUTHORIZATION=header).json() == {
        "items": [],
        "next": None,
    }
    agents = client.get("/api/agents", HTTP_AUTHORIZATION=header).json()
    assert [a["name"] for a in agents] == ["demo"]
    usage = client.get("/api/usage?group=agent", HTTP_AUTHORIZATION=header).json()
    assert {row["key"] for row in usage["items"]} <= {"demo"}
    refused = client.post(
        "/api/sessions",
        {"agent": "approval", "input": "pay invoice 4"},
        content_type="application/json",
        HTTP_AUTHORIZATION=header,
    )
    assert refused.status_code == 403 and "'approval'" in refused.json()["detail"]
    started = client.post(
        "/api/sessions",
        {"agent": "demo", "input": "hi"},
        content_type="application/json",
        HTTP_AUTHORIZATION=header,
    )
    assert started.status_code == 201
    # An agent no team owns is for global roles only.
    unowned = client.post(
        "/api/sessions",
        {"agent": "echo", "input": "hi"},
        content_type="application/json",
        HTTP_AUTHORIZATION=header,
    )
    assert unowned.status_code == 403


def test_each_operator_acts_on_their_own_teams_session_only(client, teams):
    ours = session_start(agent="demo", input="hi")
    theirs = teams["theirs"]
    support = bearer(teams["support_operator"])
    billing = bearer(teams["billing_operator"])
    cancel = f"/api/sessions/{ours.id}/cancel"
    assert (
        client.post(cancel, {}, "application/json", HTTP_AUTHORIZATION=billing).status_code == 404
    )
    assert (
        client.post(cancel, {}, "application/json", HTTP_AUTHORIZATION=support).status_code == 200
    )
    approve = f"/api/sessions/{theirs.id}/approve"
    assert (
        client.post(approve, {}, "application/json", HTTP_AUTHORIZATION=support).status_code == 404
    )
    assert (
        client.post(approve, {}, "application/json", HTTP_AUTHORIZATION=billing).status_code == 202
    )


def test_a_team_viewer_reads_the_teams_sessions_and_changes_none(client, teams):
    ours = teams["ours"]
    client.force_login(teams["support_viewer"])
    assert client.get(f"/sessions/{ours.id}/").status_code == 200
    assert client.post(f"/sessions/{ours.id}/actions/take/").status_code == 403
    header = bearer(teams["support_viewer"])
    assert client.get(f"/api/sessions/{ours.id}", HTTP_AUTHORIZATION=header).status_code == 200
    take = f"/api/sessions/{ours.id}/take"
    assert client.post(take, {}, "application/json", HTTP_AUTHORIZATION=header).status_code == 403
    # Operating in one team and viewing in another: read there, act only in the first.
    Membership.objects.create(user=teams["billing_operator"], team=teams["support"], role="viewer")
    operator = User.objects.get(pk=teams["billing_operator"].pk)
    client.force_login(operator)
    assert client.get(f"/sessions/{ours.id}/").status_code == 200
    assert client.post(f"/sessions/{ours.id}/actions/take/").status_code == 403
    with pytest.raises(ActionError) as refused:
        from sessions_app.services.workqueue import session_take

        session_take(session_id=ours.id, actor=operator)
    assert refused.value.status == 403
    assert AgentSession.objects.get(pk=ours.pk).owner is None


def test_a_session_is_handed_only_to_someone_of_its_team(teams):
    from sessions_app.services.workqueue import session_hand

    ours = teams["ours"]
    with pytest.raises(ActionError, match="does not act on this session's team"):
        session_hand(session_id=ours.id, to="billing-operator", actor=teams["support_operator"])
    session_hand(session_id=ours.id, to="support-team_admin", actor=teams["support_operator"])
    assert AgentSession.objects.get(pk=ours.pk).owner == teams["support_team_admin"]


def test_a_hand_offers_everyone_who_may_act_on_the_session_and_no_one_else(client, teams, users):
    from django.contrib.auth.models import Group

    from sessions_app.permissions import can_operate_session

    ours = teams["ours"]
    admin = User.objects.create_user("ada", password="pw")
    admin.groups.add(Group.objects.get(name="admin"))
    User.objects.create_superuser("sue", password="pw")
    gone = User.objects.create_user("support-gone", password="pw", is_active=False)
    Membership.objects.create(user=gone, team=teams["support"], role="operator")
    # A global viewer who operates in the support team acts on its sessions.
    Membership.objects.create(user=users["viewer"], team=teams["support"], role="operator")
    client.force_login(teams["support_viewer"])  # reading the session is enough to ask
    response = client.get(f"/sessions/{ours.id}/operators/", HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    offered = set(re.findall(r'<option value="([^"]+)">', response.content.decode()))
    assert offered == {
        "support-operator",
        "support-team_admin",
        "olivia",  # a global operator
        "ada",  # a global admin
        "sue",
        "victor",
    }
    # Exactly whom the service would hand it to: the same rule, for every account.
    for user in User.objects.all():
        assert (user.username in offered) == can_operate_session(user, ours), user.username
    # The other team's session offers its own people, to its own team only.
    client.force_login(teams["billing_viewer"])
    response = client.get(f"/sessions/{teams['theirs'].id}/operators/", HTTP_HX_REQUEST="true")
    offered = set(re.findall(r'<option value="([^"]+)">', response.content.decode()))
    assert offered == {"billing-operator", "billing-team_admin", "olivia", "ada", "sue"}


def test_a_hand_to_someone_outside_the_sessions_team_is_refused_on_every_face(client, teams):
    ours = teams["ours"]
    before = snapshot(ours)
    client.force_login(teams["support_operator"])
    for to in ("billing-operator", "billing-team_admin", "support-viewer"):
        response = client.post(
            f"/sessions/{ours.id}/actions/hand/",
            {"to": to, "seen_owner": ""},
            HTTP_HX_REQUEST="true",
        )
        assert response.status_code == 409, (to, response.status_code)
        assert to in response.content.decode()
        header = bearer(teams["support_operator"])
        response = client.post(
            f"/api/sessions/{ours.id}/hand",
            {"to": to, "seen_owner": None},
            content_type="application/json",
            HTTP_AUTHORIZATION=header,
        )
        assert response.status_code == 409, (to, response.status_code)
        assert to in response.json()["detail"]
    assert snapshot(ours) == before
    # Handed to a team admin of the session's team, through the dashboard: taken.
    response = client.post(
        f"/sessions/{ours.id}/actions/hand/",
        {"to": "support-team_admin", "seen_owner": ""},
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 200
    assert AgentSession.objects.get(pk=ours.pk).owner == teams["support_team_admin"]


def nav_links(client, url: str = "/sessions/") -> dict[str, str]:
    """The menu's links on `url`: {text: href}."""
    page = client.get(url).content.decode()
    nav = re.search(r'<nav class="mainnav">(.*?)</nav>', page, re.S)
    assert nav is not None
    return {
        text: href for href, text in re.findall(r'<a [^>]*?href="([^"]+)"[^>]*>([^<]+)</a>', nav[1])
    }


def test_the_menu_links_only_pages_that_admit_the_person(client, teams, users):
    from django.contrib.auth.models import Group

    admin = User.objects.create_user("ada", password="pw", is_staff=True)
    admin.groups.add(Group.objects.get(name="admin"))
    staff_operator = User.objects.create_user("otto", password="pw", is_staff=True)
    staff_operator.groups.add(Group.objects.get(name="operator"))
    for who in ("support_operator", "support_team_admin"):  # team-only staff
        teams[who].is_staff = True
        teams[who].save()
    people = {
        "support_viewer": teams["support_viewer"],
        "support_operator": teams["support_operator"],
        "support_team_admin": teams["support_team_admin"],
        "viewer": users["viewer"],
        "operator": users["operator"],
        "staff_operator": staff_operator,
        "admin": admin,
    }
    expected = {
        # who: (Teams, Admin)
        "support_viewer": (False, False),
        "support_operator": (False, False),
        "support_team_admin": (True, False),
        "viewer": (False, False),
        "operator": (False, False),
        "staff_operator": (False, True),
        "admin": (True, True),
    }
    for who, user in people.items():
        client.force_login(user)
        links = nav_links(client)
        assert "Alerts" in links  # narrowed to the person's teams, for everyone with a role
        shown = ("Teams" in links, "Admin" in links)
        assert shown == expected[who], (who, links)
        # Every link in the menu opens its page; nothing it leaves out would have.
        for text, href in links.items():
            response = client.get(href)
            assert response.status_code == 200, (who, text, href, response.status_code)
        for text, href in (("Teams", "/sessions/teams/"), ("Admin", "/admin/")):
            if text not in links:
                response = client.get(href)
                assert response.status_code in (302, 403), (who, href, response.status_code)
                if response.status_code == 302:  # the admin's: to its log-in
                    assert "/login/" in response["Location"]
        # The session page links to the admin's edit only for those the admin admits.
        page = client.get(f"/sessions/{teams['ours'].id}/").content.decode()
        assert ('id="admin-link"' in page) == expected[who][1], who


def test_metrics_refuse_team_only_people_and_tokens_saying_why(client, teams, users):
    """The metrics count every team's sessions (one scrape for the deployment): global
    roles only, and a clear 403 for a team member's log-in or token, never a 500 nor a 401
    asking for the token that was given."""
    client.force_login(teams["support_team_admin"])
    response = client.get("/metrics")
    assert response.status_code == 403 and b"every team" in response.content
    client.logout()
    for header in (
        bearer(teams["support_operator"]),
        bearer(users["operator"], team=teams["support"], role="viewer"),
    ):
        response = client.get("/metrics", HTTP_AUTHORIZATION=header)
        assert response.status_code == 403 and b"every team" in response.content
    assert client.get("/metrics", HTTP_AUTHORIZATION=bearer(users["viewer"])).status_code == 200


def test_alert_rules_are_narrowed_to_the_teams_agents(client, teams, users):
    from sessions_app.models import AlertDelivery, AlertRule
    from sessions_app.services.alerts import alert_rule_create, alert_rule_delete

    def rule(name: str, agent: str) -> AlertRule:
        made, _ = alert_rule_create(
            name=name, agent=agent, reasons=["failed"], channel="email", target=f"{name}@x.org"
        )
        return made

    ours, theirs, everyone = rule("ours", "demo"), rule("theirs", "approval"), rule("all", "")
    client.force_login(teams["support_operator"])
    page = client.get("/sessions/alerts/").content.decode()
    assert "ours@x.org" in page and "theirs@x.org" not in page and "all@x.org" not in page
    assert '<option value="approval">' not in page  # the agents offered: the team's
    assert client.get(f"/sessions/alerts/{ours.id}/").status_code == 200
    for other in (theirs, everyone):
        # Another team's rule, and one over every team, do not exist for them.
        assert client.get(f"/sessions/alerts/{other.id}/").status_code == 404
        for action in ("test", "switch", "delete"):
            response = client.post(f"/sessions/alerts/{other.id}/{action}/", {"enabled": "0"})
            assert response.status_code == 404, (other.name, action)
    assert AlertRule.objects.filter(enabled=True).count() == 3
    assert not AlertDelivery.objects.exists()
    # They manage their team's rule...
    response = client.post(f"/sessions/alerts/{ours.id}/switch/", {"enabled": "0"})
    assert response.status_code == 302 and not AlertRule.objects.get(pk=ours.pk).enabled
    form = {"name": "n", "reasons": ["failed"], "channel": "email", "target": "a@x.org"}
    assert client.post("/sessions/alerts/", {**form, "agent": "demo"}).status_code == 201
    # ...and create none for another team's agent, nor for every agent.
    for agent in ("approval", ""):
        response = client.post("/sessions/alerts/", {**form, "name": f"x{agent}", "agent": agent})
        assert response.status_code == 403, agent
        assert 'id="rule-error"' in response.content.decode()
    assert not AlertRule.objects.filter(name__startswith="x").exists()
    # The service refuses it whoever calls it.
    with pytest.raises(ActionError) as refused:
        alert_rule_delete(rule=theirs, actor=teams["support_operator"])
    assert refused.value.status == 403 and AlertRule.objects.filter(pk=theirs.pk).exists()
    # The team's viewer reads the team's rule and manages nothing.
    client.force_login(teams["support_viewer"])
    assert client.get(f"/sessions/alerts/{ours.id}/").status_code == 200
    assert client.post(f"/sessions/alerts/{ours.id}/delete/").status_code == 403
    # A global viewer who operates in one team reads every rule, manages that team's only.
    Membership.objects.create(user=users["viewer"], team=teams["support"], role="operator")
    client.force_login(users["viewer"])
    page = client.get("/sessions/alerts/").content.decode()
    assert "theirs@x.org" in page and "all@x.org" in page
    assert client.post(f"/sessions/alerts/{everyone.id}/delete/").status_code == 403
    assert client.post(f"/sessions/alerts/{theirs.id}/delete/").status_code == 403
    assert client.post(f"/sessions/alerts/{ours.id}/test/").status_code == 302
    assert AlertRule.objects.count() == 4


def test_global_roles_keep_seeing_every_team(client, teams, users):
    theirs = teams["theirs"]
    client.force_login(users["viewer"])
    assert client.get(f"/sessions/{theirs.id}/").status_code == 200
    assert SECRET_TITLE in client.get("/sessions/").content.decode()
    header = bearer(users["operator"])
    response = client.get(f"/api/sessions/{theirs.id}", HTTP_AUTHORIZATION=header)
    assert response.status_code == 200


# --- Tokens -----------------------------------------------------------------------------


def test_a_team_token_acts_in_its_team_with_its_role_and_never_more_than_its_user(
    client, teams, users
):
    ours, theirs = teams["ours"], teams["theirs"]
    # A global operator's token for the support team, as a viewer there.
    header = bearer(users["operator"], team=teams["support"], role="viewer")
    assert client.get(f"/api/sessions/{ours.id}", HTTP_AUTHORIZATION=header).status_code == 200
    assert client.get(f"/api/sessions/{theirs.id}", HTTP_AUTHORIZATION=header).status_code == 404
    take = f"/api/sessions/{ours.id}/take"
    assert client.post(take, {}, "application/json", HTTP_AUTHORIZATION=header).status_code == 403
    # A team viewer's token that says "operator" is still a viewer's.
    header = bearer(teams["support_viewer"], team=teams["support"], role="operator")
    assert client.post(take, {}, "application/json", HTTP_AUTHORIZATION=header).status_code == 403
    # The same global operator's token, as an operator of the support team.
    header = bearer(users["operator"], team=teams["support"], role="operator")
    assert client.post(take, {}, "application/json", HTTP_AUTHORIZATION=header).status_code == 200
    listed = client.get("/api/sessions", HTTP_AUTHORIZATION=header).json()["items"]
    assert {s["agent"] for s in listed} == {"demo"}


def test_an_expired_or_revoked_token_is_refused_saying_why(client, teams):
    expired = bearer(teams["support_operator"], expires_at=timezone.now() - timedelta(minutes=1))
    response = client.get("/api/sessions", HTTP_AUTHORIZATION=expired)
    assert response.status_code == 401
    assert "expired" in response.json()["detail"]
    revoked = bearer(teams["support_operator"], revoked_at=timezone.now())
    response = client.get("/api/sessions", HTTP_AUTHORIZATION=revoked)
    assert response.status_code == 401 and "revoked" in response.json()["detail"]
    current = bearer(teams["support_operator"], expires_at=timezone.now() + timedelta(days=1))
    assert client.get("/api/sessions", HTTP_AUTHORIZATION=current).status_code == 200


def test_every_face_that_takes_a_token_refuses_an_ended_one_alike(client, users):
    """The API and /metrics read a bearer token through one rule: a real token that ended
    (revoked, expired, its account disabled) is refused saying why, and is not counted as
    a guess; a token that names nothing is a guess on both."""
    from sessions_app.models import LoginFailure

    ended = {
        "expired": bearer(users["viewer"], expires_at=timezone.now() - timedelta(minutes=1)),
        "revoked": bearer(users["viewer"], revoked_at=timezone.now()),
    }
    disabled_user = users["viewer"].__class__.objects.create_user("gone", password="x")
    disabled_user.groups.add(*users["viewer"].groups.all())
    ended["disabled"] = bearer(disabled_user)
    disabled_user.is_active = False
    disabled_user.save()
    for word, header in ended.items():
        api = client.get("/api/sessions", HTTP_AUTHORIZATION=header)
        assert api.status_code == 401 and word in api.json()["detail"], (word, api.content)
        scrape = client.get("/metrics", HTTP_AUTHORIZATION=header)
        assert scrape.status_code == 401 and word in scrape.content.decode(), (word, scrape)
    assert LoginFailure.objects.count() == 0
    for url in ("/api/sessions", "/metrics"):
        assert client.get(url, HTTP_AUTHORIZATION="Bearer no-such-token").status_code == 401
    assert LoginFailure.objects.count() == 2


def test_team_admins_issue_list_and_revoke_their_teams_tokens_audited(client, teams):
    support, billing = teams["support"], teams["billing"]
    admin = teams["support_team_admin"]
    token, raw = team_token_issue(
        team=support, user=teams["support_operator"], role="operator", days=30, actor=admin
    )
    assert token.team == support and token.expires_at > timezone.now() + timedelta(days=29)
    issued = AuditEvent.objects.get(action="team_issue_token")
    assert issued.actor == admin and issued.after["team"] == "support"
    assert raw not in str(issued.after)
    with pytest.raises(ActionError) as refused:  # another team's
        team_token_issue(team=billing, user=teams["billing_operator"], role="viewer", actor=admin)
    assert refused.value.status == 403
    with pytest.raises(ActionError, match="not a member"):
        team_token_issue(team=support, user=teams["billing_operator"], role="viewer", actor=admin)
    with pytest.raises(ActionError):  # an operator is not the team's admin
        team_token_issue(
            team=support,
            user=teams["support_viewer"],
            role="viewer",
            actor=teams["support_operator"],
        )

    client.force_login(admin)
    page = client.get("/sessions/teams/").content.decode()
    assert token.key_prefix in page and "Billing" not in page
    response = client.post(
        "/sessions/teams/",
        {"team": support.pk, "user": "support-viewer", "role": "viewer", "days": "7"},
    )
    assert response.status_code == 201 and "rsp_" in response.content.decode()
    response = client.post(
        "/sessions/teams/",
        {"team": billing.pk, "user": "billing-viewer", "role": "viewer", "days": "7"},
    )
    assert response.status_code == 404

    billing_token, _ = team_token_issue(
        team=billing, user=teams["billing_viewer"], role="viewer", actor=teams["billing_team_admin"]
    )
    assert client.post(f"/sessions/teams/tokens/{billing_token.pk}/revoke/").status_code == 404
    assert ApiToken.objects.get(pk=billing_token.pk).revoked_at is None
    assert client.post(f"/sessions/teams/tokens/{token.pk}/revoke/").status_code == 302
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None
    revoked = AuditEvent.objects.get(action="team_revoke_token")
    assert revoked.actor == admin and revoked.after["token"] == token.pk
    response = client.get("/api/sessions", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert response.status_code == 401 and "revoked" in response.json()["detail"]
    with pytest.raises(ActionError):
        team_token_revoke(token_id=billing_token.pk, actor=teams["support_operator"])
    # The audit log shows a team admin their team's token events, and not another team's.
    log = client.get("/audit/?action=team_issue_token").content.decode()
    assert token.key_prefix in log and billing_token.key_prefix not in log
    client.force_login(teams["support_operator"])
    log = client.get("/audit/?action=team_issue_token").content.decode()
    assert token.key_prefix not in log


# --- Teams from settings, and a deployment without teams ---------------------------------


def test_teams_declared_in_settings_are_written_and_grant_their_roles(users):
    done = teams_sync(
        {
            "research": {
                "name": "Research",
                "agents": ["research", "slow"],
                "members": {"victor": "operator", "nobody": "viewer"},
            }
        }
    )
    assert done.teams == ["research"] and done.agents == 2 and done.members == 1
    assert done.problems == ["research: no user named 'nobody'"]
    team = Team.objects.get(slug="research")
    assert sorted(team.agents.values_list("agent", flat=True)) == ["research", "slow"]
    assert Membership.objects.get(team=team, user=users["viewer"]).role == "operator"
    teams_sync({"research": {"agents": ["slow"]}})  # again: nothing doubles
    assert TeamAgent.objects.filter(agent="slow").count() == 1


def test_an_import_links_no_parent_its_importer_may_not_read(client, teams):
    """A file may name any session as its parent: linked only when the importer reads that
    session, or its title would show on the imported session's page."""
    ours = teams["ours"]
    AgentSession.objects.filter(pk=ours.pk).update(parent=teams["theirs"])
    raw = export_bytes(AgentSession.objects.get(pk=ours.pk))
    imported = import_session(raw, new_ids=True, actor=teams["support_operator"]).session
    assert AgentSession.objects.get(pk=imported.pk).parent_id is None
    client.force_login(teams["support_operator"])
    page = client.get(f"/sessions/{imported.pk}/").content.decode()
    assert SECRET_TITLE not in page and "Forked from" not in page
    # The system (a command) reads every session: the link is kept.
    again = import_session(raw, new_ids=True, actor=None)
    assert AgentSession.objects.get(pk=again.session.pk).parent_id == teams["theirs"].pk
    # A link made some other way (an admin's edit) still shows nothing the reader may not read.
    AgentSession.objects.filter(pk=imported.pk).update(parent=teams["theirs"])
    page = client.get(f"/sessions/{imported.pk}/").content.decode()
    assert SECRET_TITLE not in page and "Forked from" not in page


def test_a_teams_agents_that_no_registry_knows_are_its_choices_too(client, teams):
    """A LangGraph graph's or an SDK agent's name is in no registry of this process: a
    team that owns one still finds it among its agents (the alert form, the list filter)."""
    TeamAgent.objects.create(team=teams["support"], agent="support-graph")
    client.force_login(teams["support_operator"])
    page = client.get("/sessions/alerts/").content.decode()
    offered = re.search(r'<datalist id="agent-names">(.*?)</datalist>', page, re.S).group(1)
    assert re.findall(r'value="([^"]*)"', offered) == ["demo", "support-graph"]


def test_the_admins_active_tokens_are_neither_revoked_nor_expired(client, teams):
    live, _ = team_token_issue(
        team=teams["support"], user=teams["support_operator"], role="operator"
    )
    expired, _ = team_token_issue(
        team=teams["support"], user=teams["support_viewer"], role="viewer", name="old"
    )
    ApiToken.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(days=1))
    admin = User.objects.create_superuser("root", password="pw")
    client.force_login(admin)
    active = client.get("/admin/sessions_app/apitoken/?state=active").content.decode()
    ended = client.get("/admin/sessions_app/apitoken/?state=revoked").content.decode()
    assert live.key_prefix in active and expired.key_prefix not in active
    assert expired.key_prefix in ended and live.key_prefix not in ended


def test_the_team_page_reads_as_much_for_six_teams_as_for_two(client, teams):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    admin = User.objects.create_superuser("root", password="pw")
    client.force_login(admin)

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get("/sessions/teams/").status_code == 200
        return len(captured)

    two = queries()
    for n in range(4):
        team = Team.objects.create(name=f"Team {n}", slug=f"team-{n}")
        TeamAgent.objects.create(team=team, agent=f"agent-{n}")
        member = User.objects.create_user(f"member-{n}", password="pw")
        Membership.objects.create(user=member, team=team, role="team_admin")
        team_token_issue(team=team, user=member, role="operator")
    six = queries()
    page = client.get("/sessions/teams/").content.decode()
    assert all(f"member-{n}" in page for n in range(4))
    assert six == two, (two, six)


@pytest.mark.django_db(transaction=True)
def test_migrate_writes_the_teams_settings_declare(users, settings):
    """The deploy step that migrates applies the declaration too; a member with no account
    is named on migrate's output and does not fail it."""
    settings.RESPAWN_TEAMS = {
        "research": {"agents": ["research"], "members": {"victor": "operator", "nobody": "viewer"}}
    }
    out = io.StringIO()
    call_command("migrate", "--no-input", stdout=out)
    team = Team.objects.get(slug="research")
    assert list(team.agents.values_list("agent", flat=True)) == ["research"]
    assert Membership.objects.get(team=team, user=users["viewer"]).role == "operator"
    assert "Teams from RESPAWN_TEAMS: research; 1 agent(s), 1 member(s)" in out.getvalue()
    assert "RESPAWN_TEAMS: research: no user named 'nobody'" in out.getvalue()
    # Nothing declared: migrate leaves the teams as they are.
    settings.RESPAWN_TEAMS = {}
    call_command("migrate", "--no-input", verbosity=0)
    assert Team.objects.filter(slug="research").exists()


def test_without_teams_the_global_roles_behave_as_before(users):
    assert not Team.objects.exists()
    assert session_scope(users["viewer"]).everything
    assert session_scope(users["operator"]).everything
    assert not session_scope(users["outsider"]).everything
    assert session_scope(users["outsider"]).agents == frozenset()


def test_team_only_staff_do_not_get_the_admin_site(client, teams):
    staff = teams["support_operator"]
    staff.is_staff = True
    staff.save()
    client.force_login(staff)
    response = client.get("/admin/sessions_app/agentsession/")
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_rows_offer_actions_only_on_the_sessions_their_reader_may_change(client, teams):
    """Someone who acts on one team's sessions and reads another's is offered the take
    button and the bulk checkbox on the first team's rows only: never a button that the
    action would answer with a 403."""
    from django.urls import reverse

    person = teams["support_operator"]
    Membership.objects.create(user=person, team=teams["billing"], role="viewer")
    ours, theirs = teams["ours"], teams["theirs"]
    # Both wait for a person, past the target: both are in "approvals".
    AgentSession.objects.filter(pk=ours.pk).update(status=Status.WAITING_INPUT)
    AgentSession.objects.filter(pk__in=[ours.pk, theirs.pk]).update(
        updated_at=timezone.now() - timedelta(days=2)
    )
    client.force_login(person)
    listed = client.get("/sessions/").content.decode()
    assert str(theirs.id) in listed and f'id="pick-{ours.id}"' in listed
    assert f'id="pick-{theirs.id}"' not in listed
    # The address of a section's page, opened as a page (a new tab): the whole page.
    response = client.get("/sessions/attention/?section=approvals")
    assert response.status_code == 200 and b"Needs attention" in response.content
    waiting = response.content.decode()
    assert str(theirs.id) in waiting and str(ours.id) in waiting
    assert reverse("sessions:action", args=[ours.id, "take"]) in waiting
    assert reverse("sessions:action", args=[theirs.id, "take"]) not in waiting

    def row(session) -> str:
        return re.search(rf'<tr [^>]*data-session="{session.id}">(.*?)</tr>', waiting, re.S)[1]

    # The remedy is told to whom it is open; the reader is sent to the page.
    assert "approve or reject" in row(ours) and "open it" not in row(ours)
    assert "approve or reject" not in row(theirs) and "open it" in row(theirs)
    # The action itself refuses as the page does.
    take = reverse("sessions:action", args=[theirs.id, "take"])
    assert client.post(take, {"seen_owner": ""}).status_code == 403
    # The agents page offers to start a session of the agents they act on only.
    agents = client.get(reverse("sessions:agents")).content.decode()
    assert 'id="agent-approval"' in agents and 'id="agent-demo"' in agents
    starts = re.findall(r'class="start-agent" href="[^"]*\?agent=([^"]+)"', agents)
    assert starts == ["demo"], starts


def test_a_team_operator_imports_only_its_teams_agents_and_learns_nothing_else(client, teams):
    """A file of another team's agent is refused, whatever id it keeps: with a new id, and
    with the id of a session that exists (refused on the agent, not as "exists already":
    the refusal says nothing of the other team's sessions). Nothing is written."""
    from sessions_app.upkeep.transfer import TransferError

    theirs = teams["theirs"]
    raw = export_bytes(AgentSession.objects.get(pk=theirs.pk))
    before = (AgentSession.objects.count(), Step.objects.count())
    for new_ids in (True, False):
        with pytest.raises(TransferError) as refused:
            import_session(raw, new_ids=new_ids, actor=teams["support_operator"])
        assert refused.value.code == "forbidden" and "approval" in str(refused.value)
        assert "exists" not in str(refused.value)
    # Over HTTP, the dashboard's import form says the same.
    client.force_login(teams["support_operator"])
    upload = io.BytesIO(raw)
    upload.name = "theirs.jsonl.gz"
    response = client.post("/sessions/import/", {"file": upload})  # keeping the file's id
    assert response.status_code == 400, response.status_code
    assert b"is not one your teams act on" in response.content
    assert b"exists already" not in response.content
    assert (AgentSession.objects.count(), Step.objects.count()) == before
    # Their own team's operator is told the id is taken.
    with pytest.raises(TransferError) as taken:
        import_session(raw, new_ids=False, actor=teams["billing_operator"])
    assert taken.value.code == "exists"


def test_a_token_name_too_long_is_refused_naming_it_on_every_face(client, teams, users):
    """A token's name is kept as given or refused saying why: never cut short."""
    from django.core.management.base import CommandError

    admin = teams["support_team_admin"]
    client.force_login(admin)
    before = ApiToken.objects.count()
    form = {"team": teams["support"].pk, "user": "support-viewer", "role": "viewer"}
    response = client.post("/sessions/teams/", {**form, "name": "n" * 101, "days": "7"})
    assert response.status_code == 400 and b"at most 100 characters" in response.content
    for options in ({"team": "support", "role": "viewer"}, {}):
        with pytest.raises(CommandError, match="at most 100 characters"):
            call_command("create_api_token", "support-viewer", name="n" * 101, **options)
    assert ApiToken.objects.count() == before
    response = client.post("/sessions/teams/", {**form, "name": "n" * 100, "days": "7"})
    assert response.status_code == 201
    assert ApiToken.objects.get(user__username="support-viewer").name == "n" * 100
