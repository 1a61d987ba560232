"""Error pages as `make run` serves them: the dashboard's own, with its top bar and style,
saying what is wrong in words, never Django's debug pages or the resolver's internals."""

from __future__ import annotations

import uuid

import pytest

from config import devrun

from .conftest import console_errors, login, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def styled(page) -> None:
    assert page.locator("header.topbar").count() == 1
    assert page.locator("link[rel=stylesheet]").count() == 1
    assert page.evaluate("getComputedStyle(document.body).fontFamily").startswith("system-ui")


def test_404_403_and_400_pages_are_the_dashboards_own(page, users, settings):
    # As `make run` starts its web server.
    settings.DEBUG = devrun.child_environment({})["DEBUG"] == "1"
    login(page, "olivia", "pw-operator")

    response = page.goto("/sessions/no-such-page/")
    assert response is not None and response.status == 404
    styled(page)
    assert page.locator("h1").inner_text() == "Not found"
    assert page.locator("p.error").inner_text() == "Not found: nothing lives at this address"
    assert "tried" not in page.content()  # none of the resolver's internals
    screenshot(page, "error-404")

    response = page.goto(f"/sessions/{uuid.uuid4()}/")
    assert response is not None and response.status == 404
    styled(page)
    assert page.locator("p.error").inner_text() == "Not found: no such session"

    # A control character in a parameter: refused before any view, named, styled.
    response = page.goto("/sessions/?q=a%00b")
    assert response is not None and response.status == 400
    styled(page)
    assert page.locator("p.error").inner_text().startswith("Bad request: ")
    assert "control character" in page.locator("p.error").inner_text()
    screenshot(page, "error-400")

    outsider = page.context.browser.new_context(base_url=page.url.split("/sessions/")[0])
    other = outsider.new_page()
    login(other, "oscar", "pw-outsider")  # no role: logged in, refused everywhere
    response = other.goto("/sessions/")
    assert response is not None and response.status == 403
    styled(other)
    assert other.locator("p.error").inner_text().startswith("Refused: ")
    outsider.close()
    assert console_errors(page, allow_http_errors=True) == []
