"""Single sign-on in Chromium against a real OpenID Connect provider on loopback
(tests/sso/provider: django-oauth-toolkit, PKCE required): log in through the provider's
own page, land with the role the groups claim gives, lose it when the provider removes the
group, log out of both, and a forged state refused."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import pytest
from django.contrib.auth.models import User

from ..sso.fixtures import oidc_provider, point_at  # noqa: F401
from .conftest import console_errors, screenshot

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def provider(oidc_provider, settings, live_server):  # noqa: F811
    point_at(settings, oidc_provider)
    oidc_provider.configure(relying_party=live_server.url)
    return oidc_provider


def through_provider(page, username: str, password: str = "provider-pw-1") -> None:
    page.goto("/sessions/")
    assert "/login/" in page.url
    page.get_by_role("button", name="Log in with Acme ID").click()
    page.wait_for_url(re.compile(r"http://127\.0\.0\.1:\d+/accounts/login/"))
    page.fill("#provider-username", username)
    page.fill("#provider-password", password)
    page.get_by_role("button", name="Sign in").click()


def test_an_operator_logs_in_through_the_provider_and_out_of_both(page, provider):
    provider.person("ada", ["acme-support"])
    through_provider(page, "ada")
    page.wait_for_url("**/sessions/")
    assert page.locator("header .who").inner_text() == "ada"
    # The operator's role from the claim: she may start a session.
    assert page.locator("#new-session-link").is_visible()
    screenshot(page, "sso-operator-logged-in")

    page.get_by_role("button", name="Log out").click()
    page.wait_for_url("**/login/**")
    # Logged out at the provider too: the next login asks for the password again.
    page.get_by_role("button", name="Log in with Acme ID").click()
    page.wait_for_url(re.compile(r"http://127\.0\.0\.1:\d+/accounts/login/"))
    assert console_errors(page) == []


def test_a_viewer_lands_with_the_viewers_role_and_loses_it_with_the_group(page, provider):
    provider.person("bea", ["acme-readers"])
    through_provider(page, "bea")
    page.wait_for_url("**/sessions/")
    assert page.locator("header .who").inner_text() == "bea"
    assert page.locator("#new-session-link").count() == 0
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url("**/login/**")

    provider.person("bea", ["somewhere-else"])
    through_provider(page, "bea")
    page.wait_for_url("**/login/?sso=failed")
    assert "none of your groups has a role here" in page.locator(".login").inner_text()
    assert not User.objects.get(username="bea").groups.exists()
    page.goto("/sessions/")
    assert "/login/" in page.url
    screenshot(page, "sso-refused")


def test_a_forged_state_is_refused(page, provider):
    provider.person("dan", ["acme-support"])

    def forge(route):
        # Respawn's redirect to the provider, its state replaced on the way (a redirect's
        # next request is not routed: the redirect itself is rewritten).
        sent = route.fetch(max_redirects=0)
        parts = urlsplit(sent.headers["location"])
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        query["state"] = "forged-" + "x" * 40
        route.fulfill(
            status=302, headers={"Location": urlunsplit(parts._replace(query=urlencode(query)))}
        )

    page.route(re.compile(r".*/sso/login/.*"), forge)
    through_provider(page, "dan")
    page.wait_for_url("**/sso/callback/**")
    assert "single sign-on refused" in page.locator("main").inner_text()
    page.unroute(re.compile(r".*/sso/login/.*"))
    page.goto("/sessions/")
    assert "/login/" in page.url
    assert not User.objects.filter(username="dan").exists()


def test_a_team_operator_from_the_provider_sees_only_the_teams_sessions(page, provider):
    """Two teams, each with its agent; an operator of one through single sign-on lists,
    opens and acts on that team's sessions only: the other's is a 404 page."""
    from sessions_app.models import AgentSession, Team, TeamAgent

    for slug, agent in (("billing", "billing-bot"), ("support", "support-bot")):
        TeamAgent.objects.create(
            team=Team.objects.create(name=slug.title(), slug=slug), agent=agent
        )
    ours = AgentSession.objects.create(agent="billing-bot", title="refund for order 881")
    theirs = AgentSession.objects.create(agent="support-bot", title="printer on fire")
    provider.person("kay", ["acme-billing-ops"])
    through_provider(page, "kay")
    page.wait_for_url("**/sessions/")
    listed = page.locator("main").inner_text()
    assert "refund for order 881" in listed and "printer on fire" not in listed
    page.goto(f"/sessions/{ours.id}/")
    assert "refund for order 881" in page.locator("h1").inner_text()
    response = page.goto(f"/sessions/{theirs.id}/")
    assert response.status == 404
    assert "printer on fire" not in page.content()
    screenshot(page, "sso-team-operator-foreign-session")
    assert console_errors(page, allow_http_errors=True) == []
