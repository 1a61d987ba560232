"""Log-in throttling: a few failed attempts per account and per address, then a pause.

The throttle sits in Django's authentication itself, not in a form, so every way to log in
is throttled alike (the dashboard's /login/, the admin's /admin/login/, any form or view
that calls `authenticate`):

- `LoginThrottleBackend`, first in AUTHENTICATION_BACKENDS, refuses to let any backend
  after it check a password while the account or the address is locked;
- a failure (Django's `user_login_failed`) is recorded against the account and the
  address; a successful log-in (`user_logged_in`) clears the account's failures.

An account is its username as the log-in would match it, Unicode NFKC-normalised (as the
username field normalises what is typed) and case-folded: `ｖｉｅｗｅｒ`, `𝐯𝐢𝐞𝐰𝐞𝐫` and
`Viewer` all count against `viewer`. Only a keyed hash of it is stored, so a password typed
into the username field never reaches the database.
"""

from __future__ import annotations

import unicodedata
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import LoginView
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone
from django.utils.crypto import salted_hmac

from ..models import LoginFailure
from ..validation import client_address

THROTTLED = "_respawn_login_throttled"  # set on the request a locked log-in was refused on
THROTTLED_MESSAGE = (
    "Too many failed log-ins for this account or from this address. "
    "Try again in %(minutes)d minute(s)."
)


def normalize_username(raw: Any) -> str:
    """The account a username names: NFKC, case-folded, NFKC again (case folding can
    undo a normalisation), surrounding spaces dropped."""
    text = unicodedata.normalize("NFKC", str(raw or ""))
    return unicodedata.normalize("NFKC", text.casefold()).strip()


def account_key(raw: Any) -> str:
    return salted_hmac("respawn.login-throttle", normalize_username(raw)).hexdigest()


def window() -> timedelta:
    return timedelta(seconds=settings.RESPAWN_LOGIN_WINDOW)


def is_locked(username: Any, ip: str | None) -> bool:
    since = timezone.now() - window()
    failures = LoginFailure.objects.filter(created_at__gte=since)
    if failures.filter(account=account_key(username)).count() >= (
        settings.RESPAWN_LOGIN_MAX_PER_ACCOUNT
    ):
        return True
    return bool(ip) and failures.filter(ip=ip).count() >= settings.RESPAWN_LOGIN_MAX_PER_IP


def _username(credentials: dict[str, Any]) -> Any:
    return credentials.get("username", credentials.get(get_user_model().USERNAME_FIELD))


class LoginThrottleBackend:
    """Authenticates nobody; refuses every backend after it while the log-in is locked
    (PermissionDenied stops Django's loop over the backends). Deliberately without
    get_user or permission methods: it never owns a logged-in session."""

    def authenticate(self, request, username=None, password=None, **credentials):
        if username is None:
            username = credentials.get(get_user_model().USERNAME_FIELD)
        if is_locked(username, client_address(request)):
            if request is not None:
                setattr(request, THROTTLED, True)
            raise PermissionDenied("log-in throttled")
        return None


def record_failure(sender, credentials, request=None, **kwargs) -> None:
    """`user_login_failed`: count it, unless it was refused for being locked already (a
    locked account stays locked for the window, not for as long as someone keeps trying)."""
    if request is not None and getattr(request, THROTTLED, False):
        return
    now = timezone.now()
    # Failures older than the window count for nothing: drop them as new ones come in.
    LoginFailure.objects.filter(created_at__lt=now - window()).delete()
    LoginFailure.objects.create(
        account=account_key(_username(credentials)), ip=client_address(request), created_at=now
    )


def clear_failures(sender, request, user, **kwargs) -> None:
    """`user_logged_in`: the account's own failures are forgiven (not its address's)."""
    LoginFailure.objects.filter(account=account_key(user.get_username())).delete()


class ThrottledAuthenticationForm(AuthenticationForm):
    """Says "locked" instead of "wrong password" when the throttle refused the log-in."""

    def get_invalid_login_error(self) -> ValidationError:
        if self.request is not None and getattr(self.request, THROTTLED, False):
            minutes = max(1, int(window().total_seconds() // 60))
            return ValidationError(THROTTLED_MESSAGE, code="throttled", params={"minutes": minutes})
        return super().get_invalid_login_error()


class ThrottledAdminAuthenticationForm(ThrottledAuthenticationForm, AdminAuthenticationForm):
    pass


class ThrottledLoginView(LoginView):
    authentication_form = ThrottledAuthenticationForm

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        from . import sso

        context = super().get_context_data(**kwargs)
        context["sso_enabled"] = sso.enabled()
        context["sso_name"] = sso.provider_name()
        context["sso_failed"] = self.request.GET.get("sso") == "failed"
        context["password_login"] = settings.RESPAWN_PASSWORD_LOGIN
        return context
