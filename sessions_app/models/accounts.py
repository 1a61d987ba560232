"""Who a person logging in through single sign-on is here (sessions_app/web/sso.py)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class SsoIdentity(models.Model):
    """A person at an OpenID Connect provider (its issuer and their `sub`, which the
    provider never reuses) and their account here. Nothing else links a login to an
    account: not an e-mail, not a username that happens to match."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identity"
    )
    issuer = models.CharField(max_length=500)
    subject = models.CharField(max_length=255)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="ssoidentity_subject")
        ]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"
