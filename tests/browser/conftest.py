"""Real headless Chromium (Debian's package) driven by Playwright; no browser download."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from ..stubs.sdk_model import sdk_model  # noqa: F401

# Playwright's sync API runs an event loop in this thread; the ORM calls the tests make
# around it are still plain synchronous calls.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("RESPAWN_TEST_ARTIFACTS", ROOT / "test-artifacts"))
CHROMIUM = os.environ.get("RESPAWN_CHROMIUM", shutil.which("chromium") or "/usr/bin/chromium")


# Package scope: Playwright's sync API runs an event loop in the main thread while it is
# open, and tests after these (the OpenAI Agents SDK's, say) call asyncio.run() there.
@pytest.fixture(scope="package")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"no Chromium at {CHROMIUM}: install Debian's package (apt-get install chromium) "
            "or set RESPAWN_CHROMIUM"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        yield browser
        browser.close()


def _new_page(browser, live_server, *, width: int, height: int, accept_dialogs: bool):
    context = browser.new_context(
        base_url=live_server.url, viewport={"width": width, "height": height}
    )
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.dialogs = []
    # What the page answers a confirm() with; a test may change it between clicks.
    page.accept_dialogs = accept_dialogs

    def on_dialog(dialog):
        page.dialogs.append(dialog.message)
        dialog.accept() if page.accept_dialogs else dialog.dismiss()

    page.on("dialog", on_dialog)
    page.console_errors = []
    page.on("console", lambda m: m.type == "error" and page.console_errors.append(m.text))
    page.on("pageerror", lambda error: page.console_errors.append(f"page error: {error}"))
    return context, page


@pytest.fixture
def page(browser, live_server):
    context, page = _new_page(browser, live_server, width=1300, height=900, accept_dialogs=False)
    yield page
    context.close()


@pytest.fixture
def make_page(browser, live_server):
    """Pages of other sizes, or that accept confirm() dialogs (hx-confirm), as many as needed."""
    contexts = []

    def make(width: int = 1300, height: int = 900, *, accept_dialogs: bool = False):
        context, page = _new_page(
            browser, live_server, width=width, height=height, accept_dialogs=accept_dialogs
        )
        contexts.append(context)
        return page

    yield make
    for context in contexts:
        context.close()


# Chromium logs every 4xx/5xx answer it receives: expected when a test provokes one.
HTTP_ERROR_LOG = "Failed to load resource: the server responded with a status of"


def console_errors(page, *, allow_http_errors: bool = False) -> list[str]:
    """What the console said that it should not have."""
    return [
        e for e in page.console_errors if not (allow_http_errors and e.startswith(HTTP_ERROR_LOG))
    ]


def screenshot(page, name: str, *, full_page: bool = True) -> None:
    """A picture of the page under test-artifacts/ (the whole page, or what is in view)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=full_page)


def login(page, username: str, password: str) -> None:
    page.goto("/sessions/")
    assert "/login/" in page.url
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url("**/sessions/")
