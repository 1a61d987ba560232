"""A 5,000-step session in a real browser: find the failed step, see which attempt failed
with what error and which worker crashed where, use the timeline to get to a step; and
every page at a phone's width and at 1,920 px."""

from __future__ import annotations

import re
import time

import pytest

from sessions_app.models import Status
from sessions_app.services.core import session_start

from ..builders import build_long_session
from ..conftest import wait_for
from .conftest import console_errors, login, screenshot
from .test_dashboard_browser import run_inline

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def long(db):
    built = build_long_session(5000, title="count to 1,600 (with trouble)", status=Status.FAILED)
    built.session.last_error = "tick refused: n is out of range"
    built.session.save(update_fields=["last_error"])
    return built


def focused(page) -> int | None:
    focus = page.locator("#trace-list > li.focus")
    return int(focus.get_attribute("data-seq")) if focus.count() == 1 else None


def test_finding_the_failed_step_of_a_5000_step_session(page, users, long):
    login(page, "olivia", "pw-operator")
    started = time.monotonic()
    page.goto(f"/sessions/{long.session.id}/")
    page.evaluate("window.__noReload = true")
    header = page.locator("#header")
    assert "2 failed" in header.inner_text()
    assert "5,000" in header.inner_text() or "4,99" in header.inner_text()
    # The header's link goes straight to the failed step, details open.
    page.locator("#header").get_by_role("link", name=f"last #{long.failed_tool_seq}").click()
    step = page.locator(f"#step-{long.failed_tool_seq}")
    wait_for(lambda: step.is_visible(), what="the failed step")
    found = time.monotonic() - started
    page.evaluate("window.__noReload = true")
    assert focused(page) == long.failed_tool_seq
    assert step.locator("details.line-wrap").get_attribute("open") is not None
    assert "failed" in step.locator(".st").inner_text()
    assert "tick refused: n is out of range" in step.inner_text()
    screenshot(page, "long-session-failed-step", full_page=False)
    assert found < 10, f"{found:.1f}s to the failed step"

    # Only the failed steps, through the trace's filter.
    page.select_option("#trace select[name=status]", "failed")
    page.locator("#trace").get_by_role("button", name="Show").click()
    page.wait_for_url(re.compile(r"status=failed"))
    seqs = page.locator("#trace-list > li.step").evaluate_all(
        "els => els.map(e => Number(e.dataset.seq))"
    )
    assert seqs == sorted([long.model_error_seq, long.failed_tool_seq])
    assert page.evaluate("window.__noReload") is True

    # The retried calls: each attempt and its error.
    page.select_option("#trace select[name=status]", "retried")
    page.locator("#trace").get_by_role("button", name="Show").click()
    first = page.locator(f"#step-{long.retried_seqs[0]}")
    wait_for(lambda: first.count() == 1, what="the retried calls")
    assert "ok after 3 attempts" in first.locator(".st").inner_text()
    first.locator("summary.line").click()
    attempts = first.locator("ul.attempts > li").all_inner_texts()
    assert attempts == [
        "attempt 1: 503 Service Unavailable",
        "attempt 2: connection reset by peer",
        "attempt 3: ok",
    ]
    screenshot(page, "long-session-retried", full_page=False)
    assert console_errors(page) == []


def test_which_worker_crashed_where(page, users, long):
    login(page, "olivia", "pw-operator")
    page.goto(f"/sessions/{long.session.id}/?from={long.crash_call_seq - 3}")
    run = page.locator(f"#step-{long.crash_run_seq}")
    assert "Run 2" in run.inner_text() and "w2-host-b" in run.inner_text()
    assert (
        f"resumed after a crash: the run on w1-host-a stopped after #{long.crash_call_seq} (call)"
        in run.inner_text()
    )
    assert run.locator(".badge.crash").inner_text() == "after a crash"
    crashed = page.locator(f"#step-{long.crash_call_seq}")
    assert crashed.locator(".badge.crash").inner_text() == "worker stopped here"
    screenshot(page, "long-session-crash", full_page=False)
    # The operator's instruction after two hours, and the run it started.
    page.goto(f"/sessions/{long.session.id}/?from={long.instruction_seq}")
    instruction = page.locator(f"#step-{long.instruction_seq}")
    assert "instruction: count faster" in instruction.inner_text()
    assert instruction.locator(".badge.operator").inner_text() == "by olivia"
    assert "after olivia's instruction" in page.locator("#trace-list li.run").first.inner_text()
    assert console_errors(page) == []


def test_the_timeline_leads_to_the_steps(page, users, long):
    login(page, "olivia", "pw-operator")
    page.goto(f"/sessions/{long.session.id}/")
    page.evaluate("window.__noReload = true")
    timeline = page.locator("#timeline")
    wait_for(lambda: timeline.locator("svg.timeline-overview").count() == 1, what="the overview")
    summary = timeline.locator(".timeline-sum").inner_text()
    assert re.search(r"active · 2 h \d+ m waiting \(collapsed\)", summary), summary
    gaps = timeline.locator("svg.timeline-overview g.gap title").all_text_contents()
    assert any("waiting for a person" in g for g in gaps), gaps
    screenshot(page, "long-session-timeline", full_page=False)
    # A bar of a step the trace shows: it opens there, no page load.
    last = long.session.last_seq
    page.goto(f"/sessions/{long.session.id}/?from={last - 20}")
    page.evaluate("window.__noReload = true")
    wait_for(lambda: page.locator("svg.timeline-detail a.bar").count() > 100, what="the bars")
    page.locator(f"svg.timeline-detail a.bar[data-step='{last - 3}'] rect").click()
    wait_for(lambda: focused(page) == last - 3, what="the step of the bar")
    assert page.evaluate("window.__noReload") is True
    assert page.locator(f"#step-{last - 3}").is_visible()
    # An overview column zooms the rows to its stretch of the session.
    first_column = page.locator("svg.timeline-overview a.col").first
    first_column.locator("rect.hit").click()
    wait_for(
        lambda: "steps #1–#" in page.locator(".timeline-window").inner_text(),
        what="the zoomed rows",
    )
    # A failure mark goes to its step, wherever it is in the trace.
    page.locator("svg.timeline-overview a.fail-mark rect").first.click()
    wait_for(lambda: focused(page) == long.model_error_seq, what="the failure mark's step")
    assert "529 overloaded" in page.locator(f"#step-{long.model_error_seq}").inner_text()
    assert console_errors(page) == []


def test_jump_to_a_step_number_and_to_the_latest(page, users, long):
    login(page, "olivia", "pw-operator")
    page.goto(f"/sessions/{long.session.id}/")
    page.evaluate("window.__noReload = true")
    page.fill("#trace input[name=from]", "4321")
    page.locator("#trace").get_by_role("button", name="Show").click()
    wait_for(lambda: focused(page) == 4321, what="step 4321")
    assert page.locator("#step-4321").is_visible()
    page.locator("#trace").get_by_role("link", name="latest steps").click()
    wait_for(
        lambda: page.locator(f"#step-{long.session.last_seq}").count() == 1, what="the last step"
    )
    page.locator("#trace").get_by_role("link", name="← earlier steps").click()
    page.wait_for_url(re.compile(rf"from={long.session.last_seq - 99}"))
    assert console_errors(page) == []


PAGES = [
    ("list", "/sessions/"),
    ("detail", "/sessions/{long}/"),
    ("detail-failed", "/sessions/{long}/?status=failed"),
    ("small", "/sessions/{small}/"),
    ("attention", "/sessions/attention/"),
    ("audit", "/audit/"),
    ("diff", "/sessions/{small}/diff/"),
]


@pytest.mark.parametrize("width", [390, 1920])
def test_every_page_fits_a_phone_and_a_wide_screen(make_page, users, width):
    long = build_long_session(600, status=Status.FAILED)
    small = run_inline(
        session_start(agent="demo", input="what is (12*7)+3, then save it as a note")
    )
    for i in range(12):
        session_start(agent="echo", input=f"a session with a rather long title, number {i}")
    page = make_page(width=width, height=900)
    login(page, "olivia", "pw-operator")
    for name, url in PAGES:
        page.goto(url.format(long=long.session.id, small=small.id))
        page.wait_for_load_state("networkidle")
        overflow = page.evaluate("document.documentElement.scrollWidth")
        assert overflow <= width, f"{name} is {overflow}px wide at {width}px"
        screenshot(page, f"{width}-{name}")
    # Every column of the session list is on the screen.
    page.goto("/sessions/")
    for cell in page.locator("#rows tr").first.locator("td").all():
        box = cell.bounding_box()
        assert box and box["x"] >= 0 and box["x"] + box["width"] <= width + 1
    assert console_errors(page) == []
