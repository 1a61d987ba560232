"""Log-in throttling: a few failed attempts per account and per address, then a pause."""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import LoginView
from django.utils import timezone

from .models import LoginFailure


def client_ip(request) -> str | None:
    # REMOTE_ADDR only: X-Forwarded-For is the client's to forge unless a proxy rewrites it.
    return request.META.get("REMOTE_ADDR") or None


class ThrottledAuthenticationForm(AuthenticationForm):
    error_messages = {
        **AuthenticationForm.error_messages,
        "throttled": (
            "Too many failed log-ins for this account or from this address. "
            "Try again in %(minutes)d minute(s)."
        ),
    }

    def clean(self):
        username = (self.data.get("username") or "").strip().lower()[:150]
        ip = client_ip(self.request) if self.request else None
        window = timedelta(seconds=settings.RESPAWN_LOGIN_WINDOW)
        since = timezone.now() - window
        by_user = LoginFailure.objects.filter(username=username, created_at__gte=since).count()
        by_ip = LoginFailure.objects.filter(ip=ip, created_at__gte=since).count() if ip else 0
        if (
            by_user >= settings.RESPAWN_LOGIN_MAX_PER_ACCOUNT
            or by_ip >= settings.RESPAWN_LOGIN_MAX_PER_IP
        ):
            raise forms.ValidationError(
                self.error_messages["throttled"],
                code="throttled",
                params={"minutes": max(1, int(window.total_seconds() // 60))},
            )
        try:
            cleaned = super().clean()
        except forms.ValidationError:
            LoginFailure.objects.create(username=username, ip=ip)
            raise
        LoginFailure.objects.filter(username=username).delete()
        return cleaned


class ThrottledLoginView(LoginView):
    authentication_form = ThrottledAuthenticationForm
