"""Production settings, headers, log-in throttling and the append-only audit log."""

from __future__ import annotations

import ipaddress
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import DatabaseError, transaction
from django.urls import reverse

from sessions_app.models import AuditEvent, LoginFailure
from sessions_app.services.core import session_start

ROOT = Path(__file__).resolve().parents[2]


def manage(*args, **env):
    # A deployment's environment: none of the test run's development switches.
    dropped = ("DEBUG", "RESPAWN_PRODUCTION", "SECRET_KEY", "DJANGO_ALLOW_ASYNC_UNSAFE")
    base = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    base.update({"DJANGO_SETTINGS_MODULE": "config.settings", **env})
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=base, capture_output=True, text=True
    )


def test_check_deploy_is_clean_with_production_settings():
    out = manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        DATABASE_URL=os.environ["DATABASE_URL"],
        SECRET_KEY=secrets.token_urlsafe(64),
        ALLOWED_HOSTS="respawn.example.com",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "System check identified no issues" in out.stdout


def test_production_refuses_to_start_without_a_real_secret_key():
    out = manage("check", DATABASE_URL=os.environ["DATABASE_URL"])
    assert out.returncode != 0
    assert "SECRET_KEY must be set to a long random value in production" in out.stderr
    out = manage("check", DATABASE_URL=os.environ["DATABASE_URL"], SECRET_KEY="short")
    assert out.returncode != 0


@pytest.mark.django_db
def test_every_page_carries_a_strict_csp(client, users):
    client.force_login(users["viewer"])
    for url in [reverse("login"), reverse("sessions:list"), reverse("audit"), "/api/openapi.json"]:
        policy = client.get(url)["Content-Security-Policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert "unsafe-inline" not in policy and "unsafe-eval" not in policy


def _directive(policy: str, name: str) -> str:
    return next(d.strip() for d in policy.split(";") if d.strip().startswith(name + " "))


@pytest.mark.django_db
def test_only_djangos_own_error_pages_under_debug_may_style_themselves(client, users, settings):
    """Django's 404 page under DEBUG (the development server of make run) styles itself
    inline; without DEBUG the project's own 404 page is served, under the strict policy."""
    client.force_login(users["viewer"])
    settings.DEBUG = True
    response = client.get("/sessions/no-such-page/")
    assert response.status_code == 404 and b"<style" in response.content
    policy = response["Content-Security-Policy"]
    assert "'unsafe-inline'" in _directive(policy, "style-src")
    assert _directive(policy, "frame-ancestors") == "frame-ancestors 'none'"
    assert "unsafe-inline" not in client.get(reverse("sessions:list"))["Content-Security-Policy"]
    settings.DEBUG = False
    response = client.get("/sessions/no-such-page/")
    assert response.status_code == 404 and b"<style" not in response.content
    assert "unsafe-inline" not in response["Content-Security-Policy"]


@pytest.mark.django_db
def test_pages_have_no_inline_script(client, users):
    import re

    session = session_start(agent="echo", input="hi")
    client.force_login(users["operator"])
    for url in [
        reverse("login"),
        reverse("sessions:list"),
        reverse("sessions:detail", args=[session.id]),
        reverse("sessions:attention"),
        reverse("audit"),
    ]:
        client.logout() if url == reverse("login") else None
        body = client.get(url).content.decode()
        for tag in re.findall(r"<script[^>]*>", body):
            assert "src=" in tag, (url, tag)
        assert not re.search(r"<[^>]+\son\w+=", body), url
        client.force_login(users["operator"])


@pytest.mark.django_db
def test_login_is_throttled_per_account(client, users, settings):
    settings.RESPAWN_LOGIN_MAX_PER_ACCOUNT = 3
    for _ in range(3):
        response = client.post(reverse("login"), {"username": "olivia", "password": "wrong"})
        assert "Please enter a correct username and password" in response.content.decode()
    response = client.post(reverse("login"), {"username": "olivia", "password": "pw-operator"})
    assert response.status_code == 200  # the right password is refused too, for now
    assert "Too many failed log-ins" in response.content.decode()
    assert "_auth_user_id" not in client.session
    LoginFailure.objects.all().delete()  # the window passes
    response = client.post(reverse("login"), {"username": "olivia", "password": "pw-operator"})
    assert response.status_code == 302


@pytest.mark.django_db
def test_login_is_throttled_per_address(client, users, settings):
    settings.RESPAWN_LOGIN_MAX_PER_IP = 4
    for i in range(4):
        client.post(
            reverse("login"), {"username": f"guess{i}", "password": "x"}, REMOTE_ADDR="10.9.8.7"
        )
    response = client.post(
        reverse("login"), {"username": "victor", "password": "pw-viewer"}, REMOTE_ADDR="10.9.8.7"
    )
    assert "Too many failed log-ins" in response.content.decode()
    response = client.post(
        reverse("login"), {"username": "victor", "password": "pw-viewer"}, REMOTE_ADDR="10.9.8.8"
    )
    assert response.status_code == 302


PROXY = {"REMOTE_ADDR": "10.0.0.5"}  # the reverse proxy every request comes through


def _log_in(client, password: str, forwarded_for: str, **meta):
    return client.post(
        reverse("login"),
        {"username": "victor", "password": password},
        HTTP_X_FORWARDED_FOR=forwarded_for,
        **{**PROXY, **meta},
    )


@pytest.mark.django_db
def test_behind_a_trusted_proxy_one_clients_guesses_lock_only_that_client(client, users, settings):
    settings.RESPAWN_LOGIN_MAX_PER_IP = 4
    settings.RESPAWN_LOGIN_MAX_PER_ACCOUNT = 100
    settings.RESPAWN_TRUSTED_PROXIES = (
        ipaddress.ip_network("10.0.0.0/24"),
        ipaddress.ip_network("::1"),
    )
    for i in range(4):  # the guesser writes what it likes left of what the proxy appends
        _log_in(client, "wrong", f"198.51.100.{i}, 203.0.113.9")
    assert set(LoginFailure.objects.values_list("ip", flat=True)) == {"203.0.113.9"}
    locked = _log_in(client, "pw-viewer", "203.0.113.9")
    assert "Too many failed log-ins" in locked.content.decode()
    # Another client through the same proxy (two proxies deep) is not locked out.
    assert _log_in(client, "pw-viewer", "192.0.2.44, 10.0.0.7").status_code == 302


@pytest.mark.django_db
def test_x_forwarded_for_is_ignored_unless_a_trusted_proxy_sent_it(client, users, settings):
    settings.RESPAWN_LOGIN_MAX_PER_IP = 100
    settings.RESPAWN_TRUSTED_PROXIES = (ipaddress.ip_network("10.0.0.5"),)
    _log_in(client, "wrong", "203.0.113.9", REMOTE_ADDR="192.0.2.1")  # not a proxy: forged
    _log_in(client, "wrong", "not an address")  # a proxy that names nobody: the proxy
    settings.RESPAWN_TRUSTED_PROXIES = ()
    _log_in(client, "wrong", "203.0.113.10")  # no proxy trusted: REMOTE_ADDR
    assert list(LoginFailure.objects.order_by("id").values_list("ip", flat=True)) == [
        "192.0.2.1",
        "10.0.0.5",
        "10.0.0.5",
    ]


@pytest.mark.django_db
def test_the_audit_names_the_client_behind_a_trusted_proxy(client, users, settings):
    settings.RESPAWN_TRUSTED_PROXIES = (ipaddress.ip_network("10.0.0.0/24"),)
    session = session_start(agent="echo", input="hi")
    client.force_login(users["operator"])
    response = client.post(
        reverse("sessions:action", args=[session.id, "cancel"]),
        {"reason": "wrong input"},
        HTTP_X_FORWARDED_FOR="203.0.113.9",
        **PROXY,
    )
    assert response.status_code in (200, 302)
    event = AuditEvent.objects.filter(session=session).latest("id")
    assert (event.action, event.request_meta["ip"]) == ("cancel", "203.0.113.9")


@pytest.mark.django_db
def test_audit_log_is_append_only_in_the_database(users):
    session = session_start(agent="echo", input="hi", actor=users["operator"])
    event = AuditEvent.objects.get(session=session)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(pk=event.pk).update(action="nothing happened")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(pk=event.pk).delete()
    event.action = "edited"
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        event.save()
    assert AuditEvent.objects.get(pk=event.pk).action == "start"
    # Deleting the session leaves its audit trail untouched (and pointing at it).
    session_id = session.id
    session.delete()
    assert AuditEvent.objects.get(pk=event.pk).session_id == session_id


@pytest.mark.django_db
def test_the_api_docs_and_schema_are_for_people_and_programs_it_knows(client, users):
    from sessions_app.models import ApiToken

    docs = client.get("/api/docs")
    assert docs.status_code == 302 and docs["Location"].startswith("/login/?next=/api/docs")
    schema = client.get("/api/openapi.json")
    assert (schema.status_code, schema.json()["error"]) == (401, "unauthorized")
    token = ApiToken.issue(users["viewer"])[1]
    by_program = client.get("/api/openapi.json", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert by_program.status_code == 200 and "/api/sessions" in by_program.json()["paths"]
    client.force_login(users["outsider"])  # no role
    assert client.get("/api/openapi.json").status_code == 403
    client.force_login(users["viewer"])
    assert client.get("/api/docs").status_code == 200
    assert client.get("/api/openapi.json").status_code == 200


@pytest.mark.django_db
def test_a_body_or_form_over_the_limits_is_a_400_naming_the_limit(users, settings):
    from django.test import Client

    from sessions_app.models import ApiToken

    browser = Client(enforce_csrf_checks=True)  # CSRF reads the form before any view
    fields = "&".join(f"f{i}=x" for i in range(settings.DATA_UPLOAD_MAX_NUMBER_FIELDS + 1))
    many = browser.post("/login/", fields, content_type="application/x-www-form-urlencoded")
    assert many.status_code == 400 and "fields" in many.content.decode()
    big = "a=" + "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)
    large = browser.post("/sessions/", big, content_type="application/x-www-form-urlencoded")
    assert large.status_code == 400 and "request body is over" in large.content.decode()
    token = ApiToken.issue(users["operator"])[1]
    body = '{"input": "' + "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1) + '"}'
    api = browser.post(
        "/api/sessions", body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert api.status_code == 400 and api["Content-Type"].startswith("application/json")
    assert "request body is over" in api.json()["detail"]
