"""Single sign-on against a real OpenID Connect provider on loopback (django-oauth-toolkit
with PKCE required, tests/sso/provider): the browser's side is played over HTTP, Respawn's
through Django's test client, the code exchange and the provider's keys over real HTTP."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import pytest
import requests
from django.contrib.auth.models import User
from django.test import Client

from sessions_app import permissions
from sessions_app.models import SsoIdentity

from .fixtures import CLIENT_ID, oidc_provider, point_at  # noqa: F401

pytestmark = pytest.mark.django_db

RELYING_PARTY = "http://testserver"  # Django's test client


@pytest.fixture
def provider(oidc_provider, settings):  # noqa: F811
    point_at(settings, oidc_provider)
    oidc_provider.configure(relying_party=RELYING_PARTY)
    return oidc_provider


def tampered(url: str, **params: str) -> str:
    """`url` with some of its query parameters replaced (what an attacker in the middle, or
    a forged link, would send the provider)."""
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    query.update(params)
    return urlunsplit(parts._replace(query=urlencode(query)))


def at_provider(authorize_url: str, username: str, password: str = "provider-pw-1"):
    """The browser at the provider: the authorization request, the provider's log-in form,
    and back. Returns the provider's own session (its cookies) and where it sent the
    browser back to (Respawn's callback with the code and the state)."""
    browser = requests.Session()
    reply = browser.get(authorize_url, allow_redirects=False, timeout=10)
    assert reply.status_code == 302 and "/accounts/login/" in reply.headers["Location"]
    form_url = requests.compat.urljoin(authorize_url, reply.headers["Location"])
    form = browser.get(form_url, timeout=10)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
    next_url = parse_qs(urlsplit(form_url).query)["next"][0]
    reply = browser.post(
        form_url,
        data={
            "csrfmiddlewaretoken": token,
            "username": username,
            "password": password,
            "next": next_url,
        },
        headers={"Referer": form_url},
        allow_redirects=False,
        timeout=10,
    )
    assert reply.status_code == 302, reply.text[:500]
    reply = browser.get(
        requests.compat.urljoin(form_url, reply.headers["Location"]),
        allow_redirects=False,
        timeout=10,
    )
    assert reply.status_code == 302, reply.text[:500]
    return browser, reply.headers["Location"]


def sso_login(client: Client, username: str, **tamper: str):
    """A whole login through the provider; `tamper` replaces parameters of the
    authorization request on its way. Returns Respawn's answer to the callback and the
    browser's session at the provider."""
    start = client.get("/sso/login/", {"next": "/sessions/"})
    assert start.status_code == 302
    authorize = start["Location"]
    assert authorize.startswith("http://127.0.0.1:")
    browser, back = at_provider(tampered(authorize, **tamper) if tamper else authorize, username)
    assert back.startswith(f"{RELYING_PARTY}/sso/callback/?"), back
    parts = urlsplit(back)
    return client.get(parts.path, parse_qs(parts.query)), browser


def logged_in_as(client: Client) -> str | None:
    reply = client.get("/sessions/")
    if reply.status_code == 302:
        return None
    assert reply.status_code == 200
    return reply.wsgi_request.user.get_username()


def test_the_authorization_request_uses_pkce_state_and_nonce(provider):
    client = Client()
    start = client.get("/sso/login/")
    query = parse_qs(urlsplit(start["Location"]).query)
    assert query["client_id"] == [CLIENT_ID]
    assert query["response_type"] == ["code"]
    assert query["code_challenge_method"] == ["S256"]
    assert len(query["code_challenge"][0]) >= 43
    assert len(query["state"][0]) >= 32 and len(query["nonce"][0]) >= 32
    assert set(query["scope"][0].split()) >= {"openid", "email", "profile"}


def test_a_login_creates_the_account_with_the_role_its_groups_claim(provider):
    provider.person("ada", ["acme-support", "unrelated-group"])
    client = Client()
    reply, _ = sso_login(client, "ada")
    assert reply.status_code == 302 and reply["Location"] == "/sessions/"
    assert logged_in_as(client) == "ada"
    ada = User.objects.get(username="ada")
    assert sorted(ada.groups.values_list("name", flat=True)) == ["operator"]
    assert not ada.has_usable_password() and not ada.is_superuser
    assert ada.email == "ada@example.com"
    assert permissions.can_operate(ada) and not permissions.can_administer(ada)
    identity = SsoIdentity.objects.get(user=ada)
    assert identity.issuer == provider.issuer and identity.subject


def test_a_group_the_provider_removed_is_a_role_lost_at_the_next_login(provider):
    provider.person("bea", ["acme-support"])
    client = Client()
    sso_login(client, "bea")
    bea = User.objects.get(username="bea")
    assert permissions.can_operate(bea)

    provider.person("bea", ["acme-readers"])
    client = Client()
    reply, _ = sso_login(client, "bea")
    assert reply.status_code == 302 and logged_in_as(client) == "bea"
    bea = User.objects.get(username="bea")
    assert sorted(bea.groups.values_list("name", flat=True)) == ["viewer"]
    assert permissions.can_view(bea) and not permissions.can_operate(bea)

    # No group with a role left: refused, and the account keeps no role.
    provider.person("bea", ["unrelated-group"])
    client = Client()
    reply, _ = sso_login(client, "bea")
    assert reply.status_code == 302 and reply["Location"] == "/login/?sso=failed"
    assert logged_in_as(client) is None
    bea = User.objects.get(username="bea")
    assert not bea.groups.exists() and not permissions.can_view(bea)
    page = client.get("/login/?sso=failed").content.decode()
    assert "none of your groups has a role here" in page


def test_nobody_without_a_role_gets_an_account(provider):
    provider.person("cleo", ["unrelated-group"])
    client = Client()
    reply, _ = sso_login(client, "cleo")
    assert reply["Location"] == "/login/?sso=failed"
    assert not User.objects.filter(username__startswith="cleo").exists()


@pytest.mark.parametrize("forged", ["state", "nonce"])
def test_a_forged_state_or_nonce_is_refused(provider, forged):
    """A state this browser did not start; an ID token the provider signed with a nonce it
    was sent, not the one Respawn keeps."""
    provider.person("dan", ["acme-support"])
    client = Client()
    reply, _ = sso_login(client, "dan", **{forged: f"forged-{forged}-" + "x" * 30})
    assert reply.status_code == 400
    assert "single sign-on refused" in reply.content.decode()
    assert logged_in_as(client) is None
    assert not User.objects.filter(username="dan").exists()


def test_a_changed_pkce_challenge_fails_the_code_exchange(provider):
    """A code issued for another challenge cannot be redeemed with Respawn's verifier: the
    provider checks PKCE, and Respawn sends the verifier."""
    provider.person("fay", ["acme-support"])
    client = Client()
    reply, _ = sso_login(client, "fay", code_challenge="A" * 43)
    assert reply.status_code == 302 and reply["Location"] == "/login/?sso=failed"
    assert logged_in_as(client) is None


def test_a_callback_replayed_is_refused(provider):
    provider.person("gus", ["acme-support"])
    client = Client()
    start = client.get("/sso/login/")
    _, back = at_provider(start["Location"], "gus")
    parts = urlsplit(back)
    assert client.get(parts.path, parse_qs(parts.query)).status_code == 302
    assert logged_in_as(client) == "gus"
    # The same code and state again, in another browser or this one: refused.
    assert Client().get(parts.path, parse_qs(parts.query))["Location"] == "/login/?sso=failed"
    assert client.get(parts.path, parse_qs(parts.query)).status_code == 400


def test_a_local_account_is_never_taken_over(provider, users):
    """The provider's `olivia` is not Respawn's olivia (a local operator with a password):
    she gets an account of her own, and the local one keeps its roles and password."""
    provider.person("olivia", ["acme-readers"])
    client = Client()
    sso_login(client, "olivia")
    assert logged_in_as(client) == "olivia-2"
    local = User.objects.get(username="olivia")
    assert local.check_password("pw-operator")
    assert list(local.groups.values_list("name", flat=True)) == ["operator"]
    assert not SsoIdentity.objects.filter(user=local).exists()
    # And the next login finds her own account again, by her subject.
    client = Client()
    sso_login(client, "olivia")
    assert logged_in_as(client) == "olivia-2"
    assert User.objects.filter(username__startswith="olivia").count() == 2


def test_superuser_status_is_never_granted_by_a_claim(provider):
    provider.person("hal", ["acme-platform"])
    client = Client()
    sso_login(client, "hal")
    hal = User.objects.get(username="hal")
    assert permissions.can_administer(hal) and not hal.is_superuser and not hal.is_staff


def test_logging_out_ends_the_providers_session(provider):
    provider.person("ida", ["acme-support"])
    client = Client()
    _, browser = sso_login(client, "ida")
    assert browser.get(f"{provider.url}/test/whoami", timeout=10).text == "ida"
    reply = client.post("/logout/")
    assert reply.status_code == 302
    end_session = reply["Location"]
    assert end_session.startswith(f"{provider.issuer}/logout/?")
    query = parse_qs(urlsplit(end_session).query)
    assert query["post_logout_redirect_uri"] == [f"{RELYING_PARTY}/login/"]
    assert query["id_token_hint"][0].count(".") == 2
    assert logged_in_as(client) is None
    back = browser.get(end_session, allow_redirects=False, timeout=10)
    assert back.status_code == 302 and back.headers["Location"].startswith(
        f"{RELYING_PARTY}/login/"
    )
    assert browser.get(f"{provider.url}/test/whoami", timeout=10).text == ""


def test_the_log_in_page_offers_the_provider(provider):
    page = Client().get("/login/?next=/sessions/").content.decode()
    assert "Log in with Acme ID" in page and 'action="/sso/login/"' in page


def test_without_a_provider_there_is_no_single_sign_on(users):
    client = Client()
    assert client.get("/sso/login/").status_code == 404
    assert client.get("/sso/callback/", {"code": "x", "state": "y"}).status_code == 404
    assert "Log in with" not in client.get("/login/").content.decode()
    assert (
        client.post("/login/", {"username": "olivia", "password": "pw-operator"})["Location"]
        == "/sessions/"
    )


@pytest.mark.parametrize("page", ["/login/", "/admin/login/"])
def test_password_log_in_switched_off_leaves_only_break_glass_superusers(settings, users, page):
    settings.RESPAWN_PASSWORD_LOGIN = False
    settings.RESPAWN_BREAK_GLASS_USERS = ["root"]
    User.objects.create_superuser("root", password="pw-root-1")
    User.objects.create_superuser("other-root", password="pw-root-2")
    users["operator"].is_staff = True
    users["operator"].save()

    def log_in(username: str, password: str) -> bool:
        client = Client()
        client.post(page, {"username": username, "password": password, "next": "/sessions/"})
        return logged_in_as(client) == username

    assert not log_in("olivia", "pw-operator")
    assert not log_in("other-root", "pw-root-2")
    assert log_in("root", "pw-root-1")
    assert "Password log-in is switched off" in Client().get("/login/").content.decode()
    # API tokens are not a password log-in: unaffected (tests/sessions_app API tests).


def test_without_a_userinfo_endpoint_the_id_tokens_claims_decide(provider, settings):
    """Some providers put the groups in the ID token only (Azure AD): its claims, signed,
    are enough."""
    settings.OIDC_OP_USER_ENDPOINT = ""
    provider.person("jo", ["acme-readers"])
    client = Client()
    sso_login(client, "jo")
    assert logged_in_as(client) == "jo"
    assert list(User.objects.get(username="jo").groups.values_list("name", flat=True)) == ["viewer"]


def test_team_roles_come_from_the_groups_claim_and_go_with_them(provider):
    """A group mapped to a role in a team gives exactly that: the team's sessions, not
    everyone's; the strongest role where two groups name one team; a team nobody declared
    grants nothing; a group the provider removed is a team role lost at the next login."""
    from sessions_app.models import AgentSession, Membership, Team, TeamAgent

    billing = Team.objects.create(name="Billing", slug="billing")
    TeamAgent.objects.create(team=billing, agent="billing-bot")
    ours = AgentSession.objects.create(agent="billing-bot")
    theirs = AgentSession.objects.create(agent="echo")
    provider.person("kay", ["acme-billing-ops", "acme-billing-leads", "acme-research"])
    client = Client()
    sso_login(client, "kay")
    assert logged_in_as(client) == "kay"
    kay = User.objects.get(username="kay")
    assert list(Membership.objects.filter(user=kay).values_list("team__slug", "role")) == [
        ("billing", "team_admin")
    ]
    assert not kay.groups.exists()  # no global role
    assert permissions.can_operate_session(kay, ours)
    assert not permissions.can_view_session(kay, theirs)
    assert client.get(f"/sessions/{theirs.id}/").status_code == 404
    assert client.get(f"/sessions/{ours.id}/").status_code == 200

    provider.person("kay", ["acme-billing-ops"])
    client = Client()
    sso_login(client, "kay")
    assert list(Membership.objects.filter(user=kay).values_list("role", flat=True)) == ["operator"]
    provider.person("kay", ["acme-research"])  # a team no one declared: nothing
    client = Client()
    reply, _ = sso_login(client, "kay")
    assert reply["Location"] == "/login/?sso=failed"
    assert not Membership.objects.filter(user=kay).exists()
