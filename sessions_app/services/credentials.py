"""Every credential is throttled as the log-in is (sessions_app.web.auth): API tokens, the
metrics token and the old password of a password change. A wrong one is counted against
the client's address (RESPAWN_TRUSTED_PROXIES says which address that is); once an address
has RESPAWN_LOGIN_MAX_PER_IP failures of any kind within RESPAWN_LOGIN_WINDOW, its
credentials are refused, right or wrong, until the window has passed. The failure that
locks an address is audited ("credential_guessing"), so admins see it on the audit page."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ..models import AuditAction, LoginFailure
from ..validation import client_address, request_meta
from ..web.auth import account_key, window
from .core import ActorInfo, audit

log = logging.getLogger("respawn.credentials")

# What each kind of credential is counted as (never the secret itself).
API_TOKEN = "api token"
METRICS_TOKEN = "metrics token"
PASSWORD = "password"


def _failures_from(ip: str) -> int:
    since = timezone.now() - window()
    return LoginFailure.objects.filter(created_at__gte=since, ip=ip).count()


def locked(request: Any) -> bool:
    """Whether this client has guessed wrong too often: its credentials are refused."""
    ip = client_address(request)
    return ip is not None and _failures_from(ip) >= settings.RESPAWN_LOGIN_MAX_PER_IP


def retry_after() -> int:
    """Seconds a locked client waits at most (for a Retry-After header)."""
    return int(window().total_seconds())


def failed(request: Any, credential: str, *, account: str | None = None) -> None:
    """Count a wrong credential of this client (and of `account`, for a password). The
    failure that locks the client's address is audited and logged."""
    ip = client_address(request)
    now = timezone.now()
    with transaction.atomic():
        LoginFailure.objects.filter(created_at__lt=now - window()).delete()
        LoginFailure.objects.create(
            account=account_key(account or f"#{credential}"), ip=ip, created_at=now
        )
        if not ip or _failures_from(ip) != settings.RESPAWN_LOGIN_MAX_PER_IP:
            return
        log.warning("%s guessed wrong from %s: locked for %d s", credential, ip, retry_after())
        audit(
            actor=ActorInfo(user=None, label=f"anonymous at {ip}"),
            action=AuditAction.CREDENTIAL_GUESSING,
            session=None,
            after={
                "guessed": credential,
                "ip": ip,
                "failures": settings.RESPAWN_LOGIN_MAX_PER_IP,
                "locked_seconds": retry_after(),
            },
            request_meta=request_meta(request, "api" if credential == API_TOKEN else "web"),
        )
