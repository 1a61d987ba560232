"""The session list as an operator uses it: search as you type (and on Enter), an address
with only the filters that say something, and a bulk action on every session the filters
match, not only the 50 on the page."""

from __future__ import annotations

import re
import time
from urllib.parse import parse_qsl, urlsplit

import pytest

from sessions_app.dashboard import views
from sessions_app.models import AgentSession, AuditEvent, Status
from sessions_app.services.core import session_start

from ..conftest import wait_for
from .conftest import console_errors, login, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def query(page) -> list[tuple[str, str]]:
    """The address bar's query, as the page has it now (pushed by htmx)."""
    return parse_qsl(urlsplit(page.evaluate("location.href")).query, keep_blank_values=True)


def rows(page) -> int:
    return page.locator("tr.session-row").count()


def test_search_as_you_type_with_a_clean_address(page, users):
    for title in ("alpha report", "beta report", "gamma notes"):
        session_start(agent="echo", input=title, title=title)
    login(page, "olivia", "pw-operator")
    assert rows(page) == 3

    # Typing searches by itself, once the typing pauses; the address follows.
    page.locator("input[name=q]").press_sequentially("alpha", delay=40)
    wait_for(lambda: rows(page) == 1, what="the list to narrow as the search is typed")
    wait_for(lambda: query(page) == [("q", "alpha")], what="the address to hold the search only")
    assert "alpha report" in page.locator("tr.session-row").inner_text()

    # Enter still searches; other filters join the address, empty ones never do.
    page.locator("input[name=q]").fill("report")
    page.locator("input[name=q]").press("Enter")
    wait_for(lambda: rows(page) == 2, what="the Enter search")
    page.select_option("select[name=agent]", "echo")
    wait_for(
        lambda: query(page) == [("q", "report"), ("agent", "echo")],
        what="only the filters that say something in the address",
    )
    page.select_option("select[name=sort]", "created")
    wait_for(lambda: ("sort", "created") in query(page), what="a sort in the address")
    page.select_option("select[name=sort]", label="latest activity")  # the default
    wait_for(lambda: "sort" not in dict(query(page)), what="the default sort left out")
    page.reload()  # the address is the view
    assert rows(page) == 2 and page.locator("input[name=q]").input_value() == "report"

    # A form sent without JavaScript sends every field: the list it lands on is clean.
    page.goto("/sessions/?q=&status=&agent=echo&agent_version=&created_from=&sort=")
    assert query(page) == [("agent", "echo")]
    assert rows(page) == 3
    assert console_errors(page) == [], page.console_errors


def test_bulk_action_on_every_matching_session(page, users, monkeypatch):
    # Batches of 40, so the 130 take four requests, as thousands would take many.
    monkeypatch.setattr(views, "BULK_BATCH", 40)
    targets = [session_start(agent="echo", input=f"job {i}", title=f"job {i}") for i in range(130)]
    others = [session_start(agent="demo", input="what is 2+2", title="keep me") for _ in range(3)]
    login(page, "olivia", "pw-operator")
    page.select_option("select[name=agent]", "echo")
    wait_for(lambda: query(page) == [("agent", "echo")], what="the agent filter")
    assert rows(page) == views.PAGE_SIZE

    matching = page.locator("label.select-matching")
    wait_for(lambda: "130" in matching.inner_text(), what="the count of all matching")
    matching.locator("input").check()
    assert page.locator("[data-selected-count]").inner_text() == "all 130"
    assert page.locator("input[name=ids][form=bulk-form]:checked").count() == views.PAGE_SIZE

    page.locator("#bulk-form button[value=cancel]").click()
    confirm = page.locator("#bulk-result form.confirm")
    wait_for(lambda: confirm.is_visible(), what="the confirmation")
    said = confirm.inner_text()
    assert "This will cancel all 130 sessions matching these filters (agent echo)" in said
    screenshot(page, "list-bulk-all-matching-confirm")
    assert AgentSession.objects.filter(status=Status.CANCELLED).count() == 0  # asked first
    confirm.get_by_role("button", name="Yes, cancel all 130").click()
    report = page.locator("#bulk-result .bulk-report")
    wait_for(
        lambda: "Cancel: 130 done, 0 refused of 130 matching." in report.inner_text(),
        timeout=60,
        what="the report of every batch",
    )
    screenshot(page, "list-bulk-all-matching-report")
    # The selection is spent: nothing stays ticked for a second click to act on again.
    wait_for(
        lambda: page.locator("[data-selected-count]").inner_text() == "0",
        what="the selection to clear",
    )
    assert not matching.locator("input").is_checked()

    assert set(
        AgentSession.objects.filter(status=Status.CANCELLED).values_list("id", flat=True)
    ) == {s.id for s in targets}
    assert all(
        AgentSession.objects.get(id=s.id).status == Status.QUEUED for s in others
    )  # not matching: untouched
    # Audited one by one, by the operator, through the dashboard.
    cancels = AuditEvent.objects.filter(action="cancel")
    assert sorted(str(e.session_id) for e in cancels) == sorted(str(s.id) for s in targets)
    assert {e.actor_label for e in cancels} == {"olivia"}
    assert {e.request_meta["via"] for e in cancels} == {"dashboard"}
    # The rows and the counts redrew themselves.
    wait_for(
        lambda: page.locator("#counts a[data-status=cancelled] b").inner_text() == "130",
        what="the counts",
    )
    assert (
        re.fullmatch(
            r"(Cancelled\s*)+",
            " ".join(page.locator("tr.session-row td[data-label=Status]").all_inner_texts()).strip()
            + " ",
        )
        is not None
    )
    assert console_errors(page) == [], page.console_errors


def test_a_bulk_action_on_every_matching_session_can_be_stopped(page, users, monkeypatch):
    from sessions_app.services import core as services

    monkeypatch.setattr(views, "BULK_BATCH", 5)
    cancel = services.session_cancel

    def slow_cancel(**kwargs):
        time.sleep(0.1)  # a batch takes half a second: time to stop it
        return cancel(**kwargs)

    monkeypatch.setattr(services, "session_cancel", slow_cancel)
    for i in range(60):
        session_start(agent="echo", input=f"job {i}", title=f"job {i}")
    login(page, "olivia", "pw-operator")
    page.locator("label.select-matching input").check()
    page.locator("#bulk-form button[value=cancel]").click()
    page.locator("#bulk-result form.confirm").get_by_role(
        "button", name="Yes, cancel all 60"
    ).click()
    stop = page.locator("#bulk-result [data-bulk-next] button", has_text="Stop here")
    wait_for(lambda: stop.count() == 1 and stop.is_visible(), what="the first batch's report")
    stop.click()
    report = page.locator("#bulk-result .bulk-report")
    wait_for(lambda: "Stopped" in report.inner_text(), what="the stop")
    page.wait_for_timeout(2000)  # a batch that was on its way lands; no other follows
    cancelled = AgentSession.objects.filter(status=Status.CANCELLED).count()
    assert 5 <= cancelled <= 15
    page.wait_for_timeout(1500)
    assert AgentSession.objects.filter(status=Status.CANCELLED).count() == cancelled
    assert "Stopped" in report.inner_text() and "going on" not in report.inner_text()
    assert f"{cancelled} done" in report.inner_text()
    assert console_errors(page) == [], page.console_errors
