"""States that used to break the dashboard, in a real browser: live rows inside the bulk
form, error answers of every status, previews far from where they were asked for, and
pages that went stale or doubled up after an action."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from sessions_app.models import AgentSession, Status, Step
from sessions_app.services import core as services
from sessions_app.services.core import session_approve, session_start

from ..builders import build_long_session
from ..conftest import wait_for
from .conftest import console_errors, login, screenshot
from .test_dashboard_browser import run_inline, trace_seqs

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def layout_intact(page) -> None:
    """Still the dashboard: one top bar, one stylesheet, no error page swapped in."""
    assert page.locator("header.topbar").count() == 1
    assert page.locator("link[rel=stylesheet]").count() == 1
    assert page.evaluate("getComputedStyle(document.body).fontFamily").startswith("system-ui")
    assert page.evaluate("window.__noReload") is True


def test_running_rows_refresh_in_place_and_bulk_cancel_stops_them(page, users, start_worker):
    start_worker(RESPAWN_SLOW_DELAY="0.5")
    sessions = [
        session_start(agent="slow", input="count to 40", title=f"long count {i}") for i in (1, 2)
    ]
    wait_for(
        lambda: AgentSession.objects.filter(status=Status.RUNNING).exists(),
        timeout=30,
        what="a running session",
    )
    login(page, "olivia", "pw-operator")
    page.evaluate("window.__noReload = true")
    # Several refreshes of the live rows (every 2 s): each stays a row of the table.
    page.wait_for_timeout(4500)
    statuses = {}
    for session in sessions:
        row = page.locator(f"table.sessions > tbody#rows > tr#row-{session.id}")
        assert row.count() == 1
        assert row.locator(f"input#pick-{session.id}").count() == 1
        statuses[session.id] = row.get_attribute("data-status")
    assert "running" in statuses.values()
    assert page.locator("#bulk-result").inner_text().strip() == ""
    assert console_errors(page) == []

    for session in sessions:
        page.locator(f"#pick-{session.id}").check()
    assert page.locator("[data-selected-count]").inner_text() == "2"
    page.get_by_role("button", name="Cancel selected…").click()
    confirm = page.locator("#bulk-result form.confirm")
    assert "This will cancel 2 sessions." in confirm.inner_text()
    confirm.get_by_role("button", name="Yes, cancel 2").click()
    wait_for(
        lambda: "Cancel: 2 done, 0 refused." in page.locator("#bulk-result").inner_text(),
        what="the bulk report",
    )
    assert set(AgentSession.objects.values_list("status", flat=True)) == {Status.CANCELLED}
    # The rows and the counts redraw themselves; nothing was reloaded.
    wait_for(
        lambda: all(
            page.locator(f"#row-{s.id}").get_attribute("data-status") == "cancelled"
            for s in sessions
        ),
        what="the rows to show the cancel",
    )
    wait_for(
        lambda: page.locator("#counts a[data-status=cancelled] b").inner_text() == "2",
        what="the counts to show the cancel",
    )
    assert page.locator("#counts a[data-status=running] b").inner_text() == "0"
    layout_intact(page)
    screenshot(page, "list-bulk-cancel-running")
    assert console_errors(page) == []


def test_errors_of_every_status_are_shown_next_to_the_action(page, users, settings, monkeypatch):
    # With DEBUG on (DEBUG=1 make run).
    settings.DEBUG = True
    done = run_inline(session_start(agent="demo", input="what is (12*7)+3, then save it as a note"))
    waiting = run_inline(session_start(agent="approval", input="pay invoice 9"))
    login(page, "olivia", "pw-operator")

    page.goto(f"/sessions/{done.id}/")
    page.evaluate("window.__noReload = true")
    page.locator("details.edit summary").click()
    correct = page.locator("form[action$='/actions/correct/']")
    correct.locator("textarea[name=output]").fill("{not json")
    correct.get_by_role("button", name="Correct and resume").click()
    error = correct.locator(".form-error")
    wait_for(lambda: error.is_visible(), what="the 400 next to the correction")
    assert error.inner_text().startswith("the corrected output: not valid JSON")
    assert correct.locator("textarea[name=output]").input_value() == "{not json"  # kept
    layout_intact(page)
    screenshot(page, "error-400-inline")

    message = page.locator("form[action$='/actions/message/']")
    message.locator("textarea").fill("    ")
    message.get_by_role("button", name="Send message").click()
    wait_for(lambda: message.locator(".form-error").is_visible(), what="the empty message")
    assert message.locator(".form-error").inner_text() == "content must not be empty"

    # 500: a bug on the server says so, next to the form, and the page stays.
    def broken(**kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(services, "session_add_instruction", broken)
    instruct = page.locator("form[action$='/actions/instruct/']")
    instruct.locator("textarea").fill("be brief")
    instruct.get_by_role("button", name="Add instruction and resume").click()
    wait_for(lambda: instruct.locator(".form-error").is_visible(), what="the 500")
    assert instruct.locator(".form-error").inner_text().startswith("Server error (500)")
    layout_intact(page)

    # No answer at all (the connection failed).
    page.route("**/actions/instruct/", lambda route: route.abort())
    instruct.get_by_role("button", name="Add instruction and resume").click()
    wait_for(
        lambda: "Could not reach the server" in instruct.locator(".form-error").inner_text(),
        what="the network error",
    )
    page.unroute("**/actions/instruct/")
    # The console said what the browser and htmx say of a failed connection; nothing else.
    assert console_errors(page, allow_http_errors=True) == [
        e for e in page.console_errors if "ERR_FAILED" in e or "htmx:" in e
    ]
    page.console_errors.clear()

    # 403: the operator is only a viewer since the page was drawn.
    operators, viewers = Group.objects.get(name="operator"), Group.objects.get(name="viewer")
    users["operator"].groups.remove(operators)
    users["operator"].groups.add(viewers)
    message.locator("textarea").fill("what is 2+2")
    message.get_by_role("button", name="Send message").click()
    wait_for(
        lambda: (
            message.locator(".form-error").inner_text()
            == "Refused: only operators can change sessions"
        ),
        what="the 403",
    )
    users["operator"].groups.add(operators)
    users["operator"].groups.remove(viewers)
    layout_intact(page)

    # 403: the form's security token is gone (Django's own page would need inline styles).
    page.context.clear_cookies(name="csrftoken")
    message.get_by_role("button", name="Send message").click()
    wait_for(
        lambda: (
            "security token is missing or expired" in message.locator(".form-error").inner_text()
        ),
        what="the CSRF refusal",
    )
    layout_intact(page)

    # 409: someone else decided first.
    page.goto(f"/sessions/{waiting.id}/")
    page.evaluate("window.__noReload = true")
    session_approve(session_id=waiting.id)
    approve = page.locator(".approval form").first
    page.accept_dialogs = True  # "the tool runs now": yes
    approve.get_by_role("button", name="Approve").click()
    wait_for(lambda: approve.locator(".form-error").is_visible(), what="the 409")
    assert approve.locator(".form-error").inner_text() == (
        "nothing is waiting for approval in this session"
    )
    screenshot(page, "error-409-inline")
    layout_intact(page)
    assert console_errors(page, allow_http_errors=True) == []


def test_a_missing_session_and_a_lost_role_answer_next_to_the_button(page, users):
    session = run_inline(session_start(agent="demo", input="what is 1+1"))
    AgentSession.objects.filter(id=session.id).update(status=Status.FAILED)
    login(page, "olivia", "pw-operator")
    page.goto(f"/sessions/{session.id}/")
    page.evaluate("window.__noReload = true")
    Step.objects.filter(session=session).delete()
    AgentSession.objects.filter(id=session.id).delete()
    resume = page.get_by_role("button", name="Resume…")
    resume.click()
    error = page.locator("#actions .buttons .form-error")
    wait_for(lambda: error.count() == 1 and error.is_visible(), what="the 404 next to Resume…")
    assert error.inner_text() == "Not found: no such session"
    layout_intact(page)
    assert console_errors(page, allow_http_errors=True) == []


def test_previews_open_where_they_are_asked_for_and_close(page, users):
    long = build_long_session(300, status=Status.FAILED)
    login(page, "olivia", "pw-operator")
    page.goto(f"/sessions/{long.session.id}/")
    page.evaluate("window.__noReload = true")
    results = page.locator("#trace-list > li.step[data-kind=tool_result]")
    far = results.nth(12)
    seq = int(far.get_attribute("data-seq"))
    button = far.get_by_role("button", name="roll back here…")
    button.click()
    preview = page.locator(f"#slot-{seq} .preview-box")
    wait_for(lambda: preview.count() == 1, what="the preview in the step's own slot")
    assert f"Roll back to checkpoint #{seq}?" in preview.inner_text()

    # Right under the button, in view: both measured in one frame, once the page has
    # settled (on a busy machine the live tail may still be drawing above them).
    def gap():
        return preview.evaluate(
            """(box, seq) => {
                const step = document.querySelector(`#trace-list > li.step[data-seq="${seq}"]`);
                const button = [...step.querySelectorAll("button")].find(
                    (b) => b.textContent.includes("roll back here"));
                const b = box.getBoundingClientRect(), u = button.getBoundingClientRect();
                return {gap: b.top - u.bottom, top: b.top};
            }""",
            seq,
        )

    def under_its_button():
        measured = gap()
        return measured if -2 <= measured["gap"] < 60 else None

    settled = wait_for(under_its_button, timeout=10, what="the preview right under its button")
    assert 0 <= settled["top"] < page.viewport_size["height"]
    screenshot(page, "rollback-preview-in-place")
    preview.get_by_role("button", name="Close this preview").click()
    assert page.locator(".preview-box").count() == 0
    button.click()
    wait_for(lambda: preview.count() == 1, what="the preview again")
    page.keyboard.press("Escape")
    assert page.locator(".preview-box").count() == 0
    # One preview at a time.
    other = results.nth(14)
    other_seq = int(other.get_attribute("data-seq"))
    button.click()
    wait_for(lambda: preview.count() == 1, what="the first preview")
    other.get_by_role("button", name="roll back here…").click()
    wait_for(
        lambda: page.locator(f"#slot-{other_seq} .preview-box").count() == 1, what="the second"
    )
    assert page.locator(".preview-box").count() == 1

    # Confirm: the session pauses, and the trace is redrawn where the operator was reading.
    page.locator(f"#slot-{other_seq} .preview-box").get_by_role(
        "button", name="Confirm rollback"
    ).click()
    wait_for(lambda: page.locator("#status").inner_text() == "Paused", what="the paused status")
    wait_for(lambda: page.locator("#status").inner_text() == "Paused", what="the pause")
    rollback_step = AgentSession.objects.get(id=long.session.id).last_seq

    def redrawn():
        # The live tail may append the rollback's step to the old list a moment before
        # the redraw replaces it: wait for the redrawn list, without the superseded steps.
        seqs = trace_seqs(page)
        return max(seqs) == rollback_step and other_seq + 1 not in seqs

    wait_for(redrawn, what="the trace to redraw")
    seqs = trace_seqs(page)
    assert len(seqs) == len(set(seqs))
    assert other_seq in seqs and other_seq + 1 not in seqs  # later steps superseded, hidden
    assert page.locator(f"#step-{other_seq}").is_visible()
    assert "Rolled back to checkpoint" in page.locator("#toast").inner_text()
    layout_intact(page)
    assert console_errors(page) == []


def test_a_live_session_stays_current_and_never_doubles_a_step(make_page, users, start_worker):
    start_worker(RESPAWN_SLOW_DELAY="0.3")
    session = session_start(agent="slow", input="count to 40")
    wait_for(
        lambda: AgentSession.objects.get(id=session.id).status == Status.RUNNING,
        timeout=30,
        what="the run",
    )
    page = make_page(accept_dialogs=True)
    login(page, "olivia", "pw-operator")
    page.goto(f"/sessions/{session.id}/")
    page.evaluate("window.__noReload = true")
    shown = len(trace_seqs(page))
    wait_for(lambda: len(trace_seqs(page)) > shown + 4, timeout=20, what="live steps")
    page.locator("#actions").get_by_role("button", name="Cancel").click()
    wait_for(lambda: page.locator("#status").inner_text() == "Cancelled", what="the cancel")
    last = AgentSession.objects.get(id=session.id).last_seq
    wait_for(lambda: max(trace_seqs(page)) == last, what="the cancel step in the trace")
    page.wait_for_timeout(2500)  # the live tail and the header stop; nothing arrives twice
    seqs = trace_seqs(page)
    assert seqs == sorted(set(seqs)) and max(seqs) == last
    cancel = page.locator(f"#step-{last}")
    assert cancel.get_attribute("data-kind") == "operator"
    assert "cancelled the session while it ran" in cancel.inner_text()
    assert page.locator("li.live").count() == 0
    assert page.locator("#actions").get_by_role("button", name="Cancel").count() == 0
    assert page.evaluate("window.__noReload") is True
    screenshot(page, "live-session-cancelled")
    assert console_errors(page) == []
