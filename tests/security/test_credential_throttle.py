"""Every credential is throttled like the log-in: API tokens, the metrics token and a
password change's old password. Wrong ones from one client lock that client's credentials
(right ones too) for the window, with a 429 and Retry-After; the lock is audited, so
admins see it on the audit page; another client is not affected."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.urls import reverse

from sessions_app.models import ApiToken, AuditEvent

pytestmark = pytest.mark.django_db

GUESSER = {"REMOTE_ADDR": "203.0.113.9"}
OTHER = {"REMOTE_ADDR": "198.51.100.7"}


@pytest.fixture
def limits(settings):
    settings.RESPAWN_LOGIN_MAX_PER_IP = 5
    settings.RESPAWN_LOGIN_MAX_PER_ACCOUNT = 5
    settings.RESPAWN_LOGIN_WINDOW = 900
    settings.RESPAWN_METRICS_TOKEN = "metrics-secret-token-of-this-deployment"


def _bearer(token: str, **meta) -> dict:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}", **meta}


def _audited() -> list[dict]:
    return [e.after for e in AuditEvent.objects.filter(action="credential_guessing").order_by("id")]


def test_api_tokens_guessed_wrong_lock_that_client_and_are_audited(client, users, limits):
    token = ApiToken.issue(users["viewer"])[1]
    for i in range(5):
        guess = client.get("/api/sessions", **_bearer(f"rsp_wrong{i:030d}", **GUESSER))
        assert guess.status_code == 401
    locked = client.get("/api/sessions", **_bearer(token, **GUESSER))  # right, yet refused
    assert locked.status_code == 429 and locked.json()["error"] == "throttled"
    assert int(locked["Retry-After"]) == 900
    assert client.get("/api/sessions", **_bearer(token, **OTHER)).status_code == 200
    assert _audited() == [
        {"guessed": "api token", "ip": "203.0.113.9", "failures": 5, "locked_seconds": 900}
    ]
    # Admins see it on the audit page.
    admin = User.objects.create_user("ada", password="pw")
    admin.groups.add(Group.objects.get_or_create(name="admin")[0])
    client.force_login(admin)
    page = client.get(reverse("audit")).content.decode()
    assert "anonymous at 203.0.113.9" in page


def test_the_metrics_token_guessed_wrong_locks_that_client(client, users, limits, settings):
    for _ in range(5):
        assert client.get("/metrics", **_bearer("not-the-token", **GUESSER)).status_code == 401
    right = _bearer(settings.RESPAWN_METRICS_TOKEN, **GUESSER)
    locked = client.get("/metrics", **right)
    assert locked.status_code == 429 and locked["Retry-After"] == "900"
    assert (
        client.get("/metrics", **_bearer(settings.RESPAWN_METRICS_TOKEN, **OTHER)).status_code
        == 200
    )
    assert [a["guessed"] for a in _audited()] == ["metrics token"]


def test_a_password_changes_old_password_is_throttled(client, users, limits):
    staff = User.objects.create_user("sam", password="pw-sam-old-1", is_staff=True)
    staff.groups.add(Group.objects.get(name="viewer"))
    client.force_login(staff)
    url = reverse("admin:password_change")

    def change(old: str):
        return client.post(
            url,
            {
                "old_password": old,
                "new_password1": "N3w-pass-phrase!",
                "new_password2": "N3w-pass-phrase!",
            },
            **GUESSER,
        )

    for i in range(5):
        wrong = change(f"guess-{i}")
        assert (
            wrong.status_code == 200
            and "old password was entered incorrectly" in wrong.content.decode()
        )
    refused = change("pw-sam-old-1")
    assert refused.status_code == 200 and "Too many failed log-ins" in refused.content.decode()
    staff.refresh_from_db()
    assert staff.check_password("pw-sam-old-1")  # unchanged
    assert [a["guessed"] for a in _audited()] == ["password"]
