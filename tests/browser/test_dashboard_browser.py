"""The dashboard in a real browser: what an operator does all day."""

from __future__ import annotations

import re

import pytest

from sessions_app.dashboard.actions import ACTIONS
from sessions_app.models import AgentSession, Status, Step
from sessions_app.services.core import session_start

from ..conftest import run_inline, wait_for
from .conftest import login, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

XSS = [
    "<script>alert('xss-script')</script>",
    "<img src=x onerror=\"alert('xss-img')\">",
    "<svg onload=\"alert('xss-svg')\"></svg>",
    "[click](javascript:alert('xss-md'))",
    "<a href=\"javascript:alert('xss-link')\">link</a>",
]


def trace_seqs(page) -> list[int]:
    return [
        int(s)
        for s in page.locator("#trace-list > li.step").evaluate_all(
            "els => els.map(e => e.dataset.seq)"
        )
    ]


def test_log_in_filter_open_and_expand(page, users):
    demo = run_inline(session_start(agent="demo", input="what is (12*7)+3, then save it as a note"))
    waiting = run_inline(session_start(agent="approval", input="pay invoice 77"))
    long_one = session_start(agent="echo", input="show me a long tool call")
    Step.objects.create(
        session=long_one,
        seq=2,
        kind="model",
        payload={
            "content": [{"type": "text", "text": "calling"}],
            "tool_calls": [{"id": "c1", "name": "lookup", "arguments": {"query": "x" * 2000}}],
        },
    )
    Step.objects.create(
        session=long_one,
        seq=3,
        kind="tool_call",
        payload={"call_id": "c1", "name": "lookup", "arguments": {"query": "needle-" + "y" * 2000}},
    )
    AgentSession.objects.filter(id=long_one.id).update(last_seq=3, status=Status.PAUSED)

    login(page, "olivia", "pw-operator")
    assert page.locator("tr.session-row").count() == 3
    screenshot(page, "session-list")

    page.select_option("select[name=status]", "waiting_input")
    page.wait_for_url(re.compile(r"status=waiting_input"))
    wait_for(lambda: page.locator("tr.session-row").count() == 1, what="the filtered list")
    assert page.locator("tr.session-row").first.get_attribute("id") == f"row-{waiting.id}"
    page.reload()  # the filter lives in the URL
    assert page.locator("tr.session-row").count() == 1

    page.goto("/sessions/?q=quokka")
    assert page.locator("tr.session-row").count() == 0
    page.goto(f"/sessions/{demo.id}/")
    assert page.locator("#status").inner_text() == "Completed"
    assert page.locator(".answer").inner_text().startswith("(12*7)+3 = 87")
    screenshot(page, "session-detail")

    page.goto(f"/sessions/{long_one.id}/")
    # One line per step; its details open on a click, and a long payload is folded again.
    step = page.locator("li.step[data-kind=tool_call]")
    assert "needle-" in step.locator("summary.line .summary").inner_text()
    step.locator("summary.line").click()
    call = step.locator("details.block").first
    assert call.get_attribute("open") is None
    assert not page.get_by_text("needle-" + "y" * 2000).is_visible()
    call.locator("summary").click()
    assert call.get_attribute("open") is not None
    assert (
        "needle-" + "y" * 2000
        in page.locator("li.step[data-kind=tool_call] details.block pre").last.inner_text()
    )


def test_roll_back_then_resume_and_watch_steps_arrive(page, users, start_worker):
    start_worker(RESPAWN_SLOW_DELAY="0.5")
    session = session_start(agent="slow", input="count to 6")
    wait_for(
        lambda: AgentSession.objects.get(id=session.id).status == Status.COMPLETED,
        timeout=30,
        what="the first run",
    )

    login(page, "olivia", "pw-operator")
    page.goto(f"/sessions/{session.id}/")
    page.evaluate("window.__noReload = true")
    before = trace_seqs(page)
    assert before[-1] == AgentSession.objects.get(id=session.id).last_seq

    # Roll back to the checkpoint after the second tick: preview first, then confirm.
    second = Step.objects.filter(session=session, kind="tool_result").order_by("seq")[1].seq
    page.locator(f"#step-{second} button", has_text="roll back here").click()
    preview = page.locator("#preview")
    assert "will be marked superseded" in preview.inner_text()
    assert "tick" in preview.inner_text()
    screenshot(page, "rollback-preview")
    preview.locator("button", has_text="Confirm rollback").click()
    wait_for(lambda: page.locator("#status").inner_text() == "Paused", what="the paused status")
    wait_for(
        lambda: (
            max(trace_seqs(page)) > second
            and all(s <= second or s > before[-1] for s in trace_seqs(page))
        ),
        what="superseded steps to leave the trace",
    )
    assert "Rolled back to checkpoint" in page.locator(".messages").inner_text()

    page.get_by_text("show superseded steps").click()
    assert page.locator("li.step.superseded").count() == before[-1] - second
    page.get_by_text("hide superseded steps").click()

    # Resume, and watch new steps arrive without reloading the page.
    page.evaluate("window.__noReload = true")
    shown = len(trace_seqs(page))
    page.get_by_role("button", name="Resume…").click()
    page.locator("#preview button", has_text="Confirm resume").click()
    wait_for(lambda: len(trace_seqs(page)) > shown + 2, timeout=30, what="new steps to stream in")
    wait_for(
        lambda: page.locator("#status").inner_text() == "Completed", timeout=30, what="completion"
    )
    assert page.evaluate("window.__noReload") is True
    assert page.locator(".answer").inner_text() == "Counted to 6."
    screenshot(page, "session-resumed-live")


def test_approve_a_pending_tool_call(page, users, start_worker):
    start_worker()
    session = session_start(agent="approval", input="pay invoice 501")
    wait_for(
        lambda: AgentSession.objects.get(id=session.id).status == Status.WAITING_INPUT,
        what="the approval pause",
    )
    login(page, "olivia", "pw-operator")
    page.goto(f"/sessions/{session.id}/")
    assert "send_payment" in page.locator(".approval").inner_text()
    screenshot(page, "approval-waiting")
    # The tool runs once approved, and nothing undoes it: the page asks first. Declined,
    # nothing happens.
    page.locator(".approval button", has_text="Approve").click()
    assert page.dialogs == [ACTIONS["approve"].confirm]
    page.wait_for_timeout(500)
    assert AgentSession.objects.get(id=session.id).status == Status.WAITING_INPUT
    page.accept_dialogs = True
    page.locator(".approval button", has_text="Approve").click()
    wait_for(
        lambda: page.locator("#status").inner_text() == "Completed",
        timeout=30,
        what="the approved run",
    )
    assert page.locator(".answer").inner_text().startswith("Payment sent")


def test_fork_from_a_checkpoint(page, users):
    session = run_inline(
        session_start(agent="demo", input="what is (12*7)+3, then save it as a note")
    )
    login(page, "olivia", "pw-operator")
    page.goto(f"/sessions/{session.id}/")
    page.accept_dialogs = True
    page.locator("#step-7 button", has_text="fork from here").click()
    assert page.dialogs == [ACTIONS["fork"].confirm]
    page.wait_for_url(re.compile(rf"/sessions/(?!{session.id})[0-9a-f-]+/$"))
    fork = AgentSession.objects.get(parent=session)
    assert page.url.endswith(f"/sessions/{fork.id}/")
    assert "Forked from" in page.locator("#header").inner_text()
    assert trace_seqs(page) == list(range(1, 8))


def test_viewer_sees_no_actions(page, users):
    session = run_inline(session_start(agent="demo", input="what is 1+1"))
    login(page, "victor", "pw-viewer")
    page.goto(f"/sessions/{session.id}/")
    assert page.locator("#actions button").count() == 0
    assert page.get_by_text("roll back here").count() == 0


def test_xss_payloads_do_not_execute(page, users):
    session = session_start(agent="demo", input=XSS[0], title=XSS[1])
    for seq, payload in enumerate(XSS, start=2):
        Step.objects.create(
            session=session,
            seq=seq,
            kind="tool_result",
            payload={
                "call_id": f"c{seq}",
                "name": payload,
                "status": "error",
                "error": payload,
                "output": {"html": payload},
            },
        )
    AgentSession.objects.filter(id=session.id).update(
        last_seq=len(XSS) + 1, status=Status.FAILED, final_answer=XSS[2], last_error=XSS[4]
    )
    login(page, "olivia", "pw-operator")
    for url in ["/sessions/", f"/sessions/{session.id}/", "/sessions/attention/", "/audit/"]:
        page.goto(url)
        page.wait_for_timeout(300)
        assert page.locator("img[src=x]").count() == 0, url
        assert page.locator("main svg[onload]").count() == 0, url
        assert page.locator("main a[href^=javascript]").count() == 0, url
    page.goto(f"/sessions/{session.id}/")
    for line in page.locator("li.step summary.line").all():
        line.click()
    for details in page.locator("li.step details.block summary").all():
        details.click()
    page.wait_for_timeout(300)
    assert page.dialogs == []
    assert XSS[1] in page.locator("#trace-list").inner_text()  # shown as text
    screenshot(page, "xss-as-text")


def test_attention_audit_and_diff_pages(page, users):
    session = run_inline(
        session_start(agent="demo", input="what is (12*7)+3, then save it as a note")
    )
    login(page, "olivia", "pw-operator")
    page.goto("/sessions/attention/")
    assert "Needs attention" in page.locator("h1").inner_text()
    screenshot(page, "attention")
    page.goto("/audit/")
    assert page.locator("table.audit-log tbody tr").count() >= 1
    screenshot(page, "audit-log")
    page.goto(f"/sessions/{session.id}/")
    page.locator(".diff-form button").click()
    wait_for(lambda: page.locator("#diff table.difftable").count() == 1, what="the diff")
    assert "final_answer" in page.locator("#diff").inner_text()
    page.locator("#timeline").scroll_into_view_if_needed()
    wait_for(lambda: page.locator("#timeline svg rect").count() > 3, what="the timeline")
    screenshot(page, "diff-and-timeline")
    # htmx did all of the above under the site's strict Content-Security-Policy.
    assert "script-src 'self'" in page.request.get("/sessions/").headers["content-security-policy"]
    assert not [e for e in page.console_errors if "Content Security Policy" in e], (
        page.console_errors
    )
