"""Single sign-on over OpenID Connect, and the password log-in's switch.

The protocol is mozilla-django-oidc's (the authorization code flow with PKCE, the state
and the nonce checked, the ID token's signature checked against the provider's keys);
this module decides who a person is here and what they may do:

- **Who.** A person is their provider's `sub` (an `SsoIdentity` row), never an e-mail or
  a username that matches: a new person gets an account of their own, named by
  RESPAWN_OIDC_USERNAME_CLAIM (made unique when taken), with no usable password. A local
  account is never taken over by a provider login.
- **What.** Their roles are read from the groups claim (RESPAWN_OIDC_GROUPS_CLAIM) at
  every login, through RESPAWN_OIDC_ROLE_MAP (a provider group → `viewer`, `operator` or
  `admin`): the roles a login grants are exactly what the claim maps to, so a group the
  provider removed is a role lost at the next login. Superuser status is never granted by
  a claim. A login whose groups map to no role is refused: no account without a role.
- **The password log-in** can be switched off (RESPAWN_PASSWORD_LOGIN=0): then only the
  superusers RESPAWN_BREAK_GLASS_USERS names log in with a password (on the dashboard's
  and the admin's log-in pages alike); API tokens are unaffected.
- **Logging out** ends the provider's session too where it has an end-session endpoint
  (RP-initiated logout with the ID token as its hint).

With no provider configured (RESPAWN_OIDC_CLIENT_ID unset) every view here is a 404 and
the backend authenticates nobody.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlencode, urlsplit

import requests
from django.conf import settings
from django.contrib import auth
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group
from django.core.exceptions import BadRequest, SuspiciousOperation
from django.db import IntegrityError, transaction
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.views.decorators.http import require_POST
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from ..models.teams import GlobalRole

log = logging.getLogger(__name__)

# The global roles (the groups of those names).
ROLES = frozenset(GlobalRole.values)
ID_TOKEN = (
    "oidc_id_token"  # where mozilla-django-oidc keeps it in the session (OIDC_STORE_ID_TOKEN)
)


def enabled() -> bool:
    return bool(
        getattr(settings, "OIDC_RP_CLIENT_ID", "")
        and getattr(settings, "OIDC_OP_AUTHORIZATION_ENDPOINT", "")
    )


def provider_origins() -> list[str]:
    """The provider's origins a browser is sent to (its log-in and its log-out)."""
    if not enabled():
        return []
    origins: list[str] = []
    for url in (
        settings.OIDC_OP_AUTHORIZATION_ENDPOINT,
        settings.RESPAWN_OIDC_END_SESSION_ENDPOINT,
    ):
        parts = urlsplit(url or "")
        origin = f"{parts.scheme}://{parts.netloc}"
        if parts.scheme in ("http", "https") and parts.netloc and origin not in origins:
            origins.append(origin)
    return origins


def provider_name() -> str:
    return getattr(settings, "RESPAWN_OIDC_PROVIDER_NAME", "") or "single sign-on"


def password_login_allowed(user: Any) -> bool:
    """Whether `user` may log in with a password: everyone, unless RESPAWN_PASSWORD_LOGIN
    is off; then only a break-glass superuser."""
    if getattr(settings, "RESPAWN_PASSWORD_LOGIN", True):
        return True
    return bool(user.is_superuser and user.get_username() in settings.RESPAWN_BREAK_GLASS_USERS)


def roles_of(claims: dict[str, Any]) -> set[str]:
    """The roles the groups claim maps to (unknown groups grant nothing): a global role
    (`operator`) or a role in a team (`support/operator`)."""
    groups = claims.get(settings.RESPAWN_OIDC_GROUPS_CLAIM) or []
    if isinstance(groups, str):
        groups = [groups]
    if not isinstance(groups, list):
        return set()
    mapping = settings.RESPAWN_OIDC_ROLE_MAP
    return {mapping[group] for group in groups if isinstance(group, str) and group in mapping}


class PasswordBackend(ModelBackend):
    """Django's password backend, refusing a password log-in RESPAWN_PASSWORD_LOGIN does
    not allow (the failure counts against the throttle like a wrong password)."""

    def user_can_authenticate(self, user: Any) -> bool:
        return super().user_can_authenticate(user) and password_login_allowed(user)

    def authenticate(self, request, username=None, password=None, **kwargs):
        if password is None:  # a provider's callback, not a password log-in
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


class SsoBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's backend, its user matched by the provider's subject and its
    roles synchronised from the groups claim at every login."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.active = enabled()
        if self.active:
            super().__init__(*args, **kwargs)
        else:
            self.UserModel = get_user_model()

    def authenticate(self, request, **kwargs):
        if not self.active:
            return None
        try:
            return super().authenticate(request, **kwargs)
        except requests.RequestException as exc:
            # The provider refused the code (a PKCE verifier that does not match, a code
            # used twice) or could not be reached: no login, the log-in page says so.
            log.warning("single sign-on failed at the provider: %s", exc)
            return None

    def verify_token(self, token: str, **kwargs: Any) -> dict[str, Any]:
        """The ID token's signature, expiry and nonce (mozilla-django-oidc), and that it
        was issued to this client by this provider."""
        payload = super().verify_token(token, **kwargs)
        audience = payload.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if settings.OIDC_RP_CLIENT_ID not in audiences:
            raise SuspiciousOperation("the ID token was issued to another client")
        if settings.RESPAWN_OIDC_ISSUER and payload.get("iss") != settings.RESPAWN_OIDC_ISSUER:
            raise SuspiciousOperation("the ID token is from another issuer")
        return payload

    def get_userinfo(self, access_token: str, id_token: str, payload: dict[str, Any]):
        """The ID token's claims with the userinfo's over them (some providers, Azure AD
        among them, put the groups in the ID token only); the ID token's alone when the
        provider has no userinfo endpoint configured."""
        if not self.OIDC_OP_USER_ENDPOINT:
            return dict(payload)
        claims = super().get_userinfo(access_token, id_token, payload)
        # OpenID Connect Core 5.3.2: the userinfo's subject must be the ID token's.
        if not isinstance(claims, dict) or claims.get("sub") != payload.get("sub"):
            raise SuspiciousOperation("the userinfo is about another subject")
        return {**payload, **claims}

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        return isinstance(claims.get("sub"), str) and bool(claims["sub"])

    def filter_users_by_claims(self, claims: dict[str, Any]):
        from ..models import SsoIdentity

        return self.UserModel.objects.filter(
            pk__in=SsoIdentity.objects.filter(issuer=_issuer(), subject=claims["sub"]).values(
                "user_id"
            )
        )

    def create_user(self, claims: dict[str, Any]):
        from ..models import SsoIdentity

        if not roles_of(claims):
            raise SuspiciousOperation(_no_role(claims))
        base = _username(claims)
        for attempt in range(100):
            username = base if attempt == 0 else f"{base[:140]}-{attempt + 1}"
            try:
                with transaction.atomic():
                    user = self.UserModel.objects.create_user(username=username)
                    user.set_unusable_password()
                    user.save(update_fields=["password"])
                    SsoIdentity.objects.create(user=user, issuer=_issuer(), subject=claims["sub"])
            except IntegrityError:
                if SsoIdentity.objects.filter(issuer=_issuer(), subject=claims["sub"]).exists():
                    raise SuspiciousOperation(
                        "this provider subject logged in twice at once"
                    ) from None
                continue  # the username is someone else's: the next one
            return self.update_user(user, claims)
        raise SuspiciousOperation(f"no free username for {base!r}")

    def update_user(self, user: Any, claims: dict[str, Any]):
        user.email = _text(claims.get("email"), 254)
        user.first_name = _text(claims.get("given_name"), 150)
        user.last_name = _text(claims.get("family_name"), 150)
        user.save(update_fields=["email", "first_name", "last_name"])
        granted = roles_of(claims)
        keep = [g for g in user.groups.all() if g.name not in ROLES]
        roles = [Group.objects.get_or_create(name=name)[0] for name in sorted(granted & ROLES)]
        user.groups.set(keep + roles)
        granted = (granted & ROLES) | set_team_roles(user, granted - ROLES)
        # permissions.py's caches of this user's roles and what they may do.
        user._respawn_roles = user._respawn_access = None
        if not granted:
            # The provider took every group with a role away: the account keeps none.
            raise SuspiciousOperation(_no_role(claims))
        log.info("single sign-on: %s logged in with roles %s", user.get_username(), sorted(granted))
        return user


def set_team_roles(user: Any, grants: set[str]) -> set[str]:
    """The person's team roles, exactly what the claim grants (`team/role`; the strongest
    where several groups name one team). A team no one declared grants nothing and is
    logged. Returns the grants that took effect."""
    from ..models import Membership, Team
    from ..models.teams import TeamRole

    rank: list[str] = [TeamRole.VIEWER, TeamRole.OPERATOR, TeamRole.TEAM_ADMIN]
    wanted: dict[str, str] = {}
    for grant in grants:
        slug, _, role = grant.partition("/")
        if slug not in wanted or rank.index(role) > rank.index(wanted[slug]):
            wanted[slug] = role
    teams = {team.slug: team for team in Team.objects.filter(slug__in=wanted)}
    for slug in sorted(set(wanted) - set(teams)):
        log.warning(
            "single sign-on: RESPAWN_OIDC_ROLE_MAP names team %r, which is not declared", slug
        )
    with transaction.atomic():
        Membership.objects.filter(user=user).exclude(team__slug__in=list(teams)).delete()
        for slug, team in teams.items():
            Membership.objects.update_or_create(
                user=user, team=team, defaults={"role": wanted[slug]}
            )
    return {f"{slug}/{wanted[slug]}" for slug in teams}


def _no_role(claims: dict[str, Any]) -> str:
    return (
        f"single sign-on refused for {claims.get('sub')!r}: no group in the"
        f" {settings.RESPAWN_OIDC_GROUPS_CLAIM!r} claim maps to a role (RESPAWN_OIDC_ROLE_MAP)"
    )


def _issuer() -> str:
    """Who vouches for a subject: the configured issuer, else the provider's endpoint."""
    return settings.RESPAWN_OIDC_ISSUER or settings.OIDC_OP_AUTHORIZATION_ENDPOINT


def _text(value: Any, limit: int) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _username(claims: dict[str, Any]) -> str:
    for claim in (settings.RESPAWN_OIDC_USERNAME_CLAIM, "preferred_username", "email", "sub"):
        value = claims.get(claim)
        if isinstance(value, str) and value.strip():
            # Django's username characters: letters, digits and @.+-_
            name = "".join(c if c.isalnum() or c in "@.+-_" else "_" for c in value.strip())
            return name[:150]
    raise SuspiciousOperation("the provider gave no usable name")


class _Enabled:
    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not enabled():
            raise Http404("single sign-on is not configured")
        return super().dispatch(request, *args, **kwargs)  # type: ignore[misc]


class LoginView(_Enabled, OIDCAuthenticationRequestView):
    """Sends the browser to the provider (state, nonce and PKCE's challenge kept in the
    session)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if enabled():
            super().__init__(*args, **kwargs)


class CallbackView(_Enabled, OIDCAuthenticationCallbackView):
    """Where the provider sends the browser back: the code exchanged (with PKCE's
    verifier), the ID token's signature and nonce checked, the person logged in."""

    @property
    def failure_url(self) -> str:
        return reverse("login") + "?sso=failed"

    def get(self, request: HttpRequest) -> HttpResponse:
        try:
            return super().get(request)
        except SuspiciousOperation as exc:
            # A state this browser's session did not start, an ID token with another
            # nonce, signed by another key or for another client: someone else's answer.
            log.warning("single sign-on refused: %s", exc)
            raise BadRequest(
                "single sign-on refused: this answer from the identity provider does not"
                " belong to a log-in started here. Start again from the log-in page."
            ) from None


@require_POST
def logout(request: HttpRequest) -> HttpResponse:
    """Log out here, then at the provider too when it has an end-session endpoint and
    this session came from it."""
    id_token = request.session.get(ID_TOKEN)
    auth.logout(request)
    end_session = getattr(settings, "RESPAWN_OIDC_END_SESSION_ENDPOINT", "")
    if id_token and end_session and enabled():
        query = urlencode(
            {
                "id_token_hint": id_token,
                "client_id": settings.OIDC_RP_CLIENT_ID,
                "post_logout_redirect_uri": request.build_absolute_uri(reverse("login")),
            }
        )
        return HttpResponseRedirect(f"{end_session}?{query}")
    return HttpResponseRedirect(reverse(settings.LOGOUT_REDIRECT_URL))
