"""One throttle for every way to log in, over real HTTP: the dashboard's /login/, the
admin's /admin/login/, and anything else that calls Django's `authenticate`; counted per
account (the username as the log-in matches it: NFKC, case-folded) and per address."""

from __future__ import annotations

import html
from datetime import timedelta

import pytest
from django.contrib.auth import authenticate
from django.contrib.auth.models import User
from django.utils import timezone

from sessions_app.models import LoginFailure
from sessions_app.web.auth import account_key

from .http import Browser

pytestmark = pytest.mark.django_db(transaction=True)

LOCKED = "Too many failed log-ins"
# Three spellings that Django's username field turns into "victor" (NFKC), and one that
# only differs in case: each counts against victor's account.
LOOK_ALIKES = ["ｖｉｃｔｏｒ", "𝐯𝐢𝐜𝐭𝐨𝐫", "𝓿𝓲𝓬𝓽𝓸𝓻", "VICTOR"]


@pytest.fixture
def throttle(settings):
    settings.RESPAWN_LOGIN_MAX_PER_ACCOUNT = 3
    settings.RESPAWN_LOGIN_MAX_PER_IP = 50
    return settings


@pytest.fixture
def staff_viewer(users):
    """victor, the viewer, made staff: he may log in on both pages."""
    victor = users["viewer"]
    victor.is_staff = True
    victor.save()
    return victor


def dashboard_works(browser: Browser) -> bool:
    return browser.get("/sessions/").status == 200


def admin_works(browser: Browser) -> bool:
    return browser.get("/admin/").status == 200


def window_passes() -> None:
    LoginFailure.objects.update(created_at=timezone.now() - timedelta(hours=1))


def test_admin_login_is_throttled(live_server, throttle, staff_viewer):
    browser = Browser(live_server.url)
    for _ in range(3):
        reply = browser.log_in("victor", "wrong", admin=True)
        assert reply.status == 200 and "Please enter the correct username" in reply.body
    reply = browser.log_in("victor", "pw-viewer", admin=True)
    assert reply.status == 200 and LOCKED in reply.body
    assert not admin_works(browser)
    window_passes()
    reply = browser.log_in("victor", "pw-viewer", admin=True)
    assert reply.status == 302 and admin_works(browser)


def test_failures_on_either_page_lock_both(live_server, throttle, staff_viewer):
    attacker = Browser(live_server.url)
    attacker.log_in("victor", "guess-1")
    attacker.log_in("victor", "guess-2", admin=True)
    attacker.log_in("victor", "guess-3")
    for admin in (False, True):
        browser = Browser(live_server.url)
        reply = browser.log_in("victor", "pw-viewer", admin=admin)
        assert reply.status == 200 and LOCKED in reply.body, admin
        assert not dashboard_works(browser) and not admin_works(browser)


@pytest.mark.parametrize("spelling", LOOK_ALIKES)
def test_look_alike_usernames_count_against_the_same_account(
    live_server, throttle, staff_viewer, spelling
):
    browser = Browser(live_server.url)
    for admin in (False, True, False):
        browser.log_in(spelling, "wrong", admin=admin)
    for admin in (False, True):
        reply = Browser(live_server.url).log_in("victor", "pw-viewer", admin=admin)
        assert LOCKED in reply.body, (spelling, admin)
    assert set(LoginFailure.objects.values_list("account", flat=True)) == {account_key("victor")}


def test_a_look_alike_username_is_the_same_account_at_log_in(live_server, staff_viewer):
    """Why the throttle must normalise: Django logs ｖｉｃｔｏｒ in as victor."""
    browser = Browser(live_server.url)
    assert browser.log_in("ｖｉｃｔｏｒ", "pw-viewer").status == 302
    assert dashboard_works(browser)


def test_the_address_is_throttled_across_pages_and_accounts(live_server, settings, users):
    settings.RESPAWN_LOGIN_MAX_PER_ACCOUNT = 100
    settings.RESPAWN_LOGIN_MAX_PER_IP = 4
    browser = Browser(live_server.url)
    for index in range(4):
        browser.log_in(f"guess{index}", "x", admin=index % 2 == 1)
    for admin in (False, True):
        reply = Browser(live_server.url).log_in("olivia", "pw-operator", admin=admin)
        assert LOCKED in reply.body


def test_a_locked_log_in_is_not_counted_again(live_server, throttle, users):
    browser = Browser(live_server.url)
    for _ in range(6):
        browser.log_in("olivia", "wrong")
    assert LoginFailure.objects.count() == 3  # the lock lasts a window, not while tried


def test_a_successful_log_in_forgives_the_account(live_server, throttle, users):
    browser = Browser(live_server.url)
    browser.log_in("olivia", "wrong")
    browser.log_in("olivia", "wrong")
    assert browser.log_in("olivia", "pw-operator").status == 302
    assert not LoginFailure.objects.filter(account=account_key("olivia")).exists()


def test_any_caller_of_authenticate_is_throttled(throttle, users):
    """A log-in form added later (or a view calling `authenticate`) gets the same lock."""
    for _ in range(3):
        assert authenticate(username="olivia", password="wrong") is None
    assert authenticate(username="olivia", password="pw-operator") is None
    window_passes()
    assert authenticate(username="olivia", password="pw-operator") == users["operator"]


def test_what_is_typed_as_a_username_is_not_stored(live_server, throttle, users):
    secret = "hunter2-typed-in-the-wrong-field"
    Browser(live_server.url).log_in(secret, "x")
    stored = list(LoginFailure.objects.values_list("account", "ip"))
    assert stored == [(account_key(secret), "127.0.0.1")]
    assert secret not in repr(stored)


def test_control_characters_in_the_log_in_form_are_a_clear_400(live_server, users):
    for page in ("/login/", "/admin/login/?next=/admin/"):
        browser = Browser(live_server.url)
        reply = browser.post_form(page, {"username": "vic\x00tor", "password": "x"})
        assert reply.status == 400, page
        said = html.unescape(reply.body)  # the dashboard's own 400 page: escaped HTML
        assert "Bad request: form field 'username'" in said and "U+0000" in said
    assert not LoginFailure.objects.exists()
    assert User.objects.filter(username="victor").exists()
