"""The session page as support staff use it: deciding an uncertain call, correcting a
tool result, rolling back, reading a finished or a running session, starting one."""

from __future__ import annotations

import json
import re

import pytest

from agent_runtime.state import OperatorAction
from sessions_app.dashboard.actions import ACTIONS
from sessions_app.models import AgentSession, AuditAction, AuditEvent, Kind, Status, Step
from sessions_app.services.core import session_start

from ..conftest import run_inline, wait_for
from ..sessions_app.test_dashboard import _uncertain_notify_session
from .conftest import console_errors, login, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_running_an_uncertain_call_again_asks_first_and_declined_does_nothing(page, users):
    session = _uncertain_notify_session()
    assert session.status == Status.WAITING_INPUT
    login(page, "olivia", "pw-operator")
    page.goto(f"/sessions/{session.id}/")
    rerun = page.locator(".uncertain button", has_text="run it again")
    rerun.click()
    question = ACTIONS["uncertain"].confirms[OperatorAction.RERUN]
    assert page.dialogs == [question]
    assert "twice" in question and "runs now" in question
    page.wait_for_timeout(500)
    session.refresh_from_db()
    assert session.status == Status.WAITING_INPUT
    assert page.locator(".uncertain").is_visible()

    page.accept_dialogs = True
    rerun.click()
    wait_for(lambda: page.locator(".uncertain").count() == 0, what="the decision to be taken")
    assert page.dialogs == [question, question]
    assert "runs again" in page.locator(".messages").inner_text()
    assert AgentSession.objects.get(id=session.id).status != Status.WAITING_INPUT
    assert console_errors(page) == []


def test_failing_an_uncertain_call_asks_its_own_question(page, users):
    session = _uncertain_notify_session()
    login(page, "olivia", "pw-operator")
    page.goto(f"/sessions/{session.id}/")
    page.locator(".uncertain button", has_text="Fail the session").click()
    assert page.dialogs == [ACTIONS["uncertain"].confirms[OperatorAction.FAIL]]
    page.wait_for_timeout(300)
    assert AgentSession.objects.get(id=session.id).status == Status.WAITING_INPUT


def test_the_correction_form_starts_from_the_chosen_results_current_output(page, users):
    session = run_inline(
        session_start(agent="demo", input="what is (12*7)+3, then save it as a note")
    )
    # Paused, so it takes an edit; the demo's results are the calculator's and the note's.
    AgentSession.objects.filter(id=session.id).update(status=Status.PAUSED)
    results = list(Step.objects.filter(session=session, kind=Kind.TOOL_RESULT).order_by("-seq"))
    assert len(results) >= 2
    login(page, "olivia", "pw-operator")
    page.goto(f"/sessions/{session.id}/")
    page.locator("details.edit summary").click()
    form = page.locator("form[action$='/actions/correct/']")
    output = form.locator("textarea[name=output]")
    assert json.loads(output.input_value()) == results[0].payload["output"]
    assert output.input_value() != "{}"

    form.locator("select[name=result_seq]").select_option(str(results[1].seq))
    assert json.loads(output.input_value()) == results[1].payload["output"]

    # Edited and sent: the correction is what was typed over the current output.
    corrected = (
        {**results[1].payload["output"], "checked": True}
        if isinstance(results[1].payload["output"], dict)
        else {"value": results[1].payload["output"], "checked": True}
    )
    output.fill(json.dumps(corrected))
    form.locator("button", has_text="Correct and resume").click()
    wait_for(
        lambda: Step.objects.filter(session=session, kind=Kind.OPERATOR).exists(),
        what="the correction step",
    )
    step = Step.objects.filter(session=session, kind=Kind.OPERATOR).get()
    assert step.payload["output"] == corrected
    assert console_errors(page) == []


def test_an_operator_starts_a_session_from_the_dashboard(page, users):
    login(page, "olivia", "pw-operator")
    page.locator("#new-session-link").click()
    page.wait_for_url("**/sessions/new/")
    agents = page.locator("select[name=agent] option").evaluate_all(
        "options => options.map(o => o.value)"
    )
    assert "echo" in agents and "demo" in agents

    # A bad budget is refused beside its field, naming it; what was typed is kept.
    page.select_option("select[name=agent]", "echo")
    page.fill("textarea[name=input]", "say hello to the new dashboard")
    page.fill("input[name=max_steps]", "ten")
    page.get_by_role("button", name="Start the session").click()
    error = page.locator(".form-error[data-field=max_steps]")
    assert "max steps" in error.inner_text() and "'ten'" in error.inner_text()
    assert page.locator("textarea[name=input]").input_value() == "say hello to the new dashboard"
    assert page.locator("select[name=agent]").input_value() == "echo"
    assert not AgentSession.objects.exists()
    screenshot(page, "new-session-refused")

    # The service's own checks, beside their fields too: a limit that is not positive.
    page.fill("input[name=max_steps]", "0")
    page.get_by_role("button", name="Start the session").click()
    assert "budgets.max_steps" in page.locator(".form-error[data-field=max_steps]").inner_text()
    page.fill("input[name=max_steps]", "5")
    page.fill("textarea[name=input]", "   ")
    page.get_by_role("button", name="Start the session").click()
    assert "input must not be empty" in page.locator(".form-error[data-field=input]").inner_text()
    assert not AgentSession.objects.exists()

    page.fill("textarea[name=input]", "say hello to the new dashboard")
    page.fill("input[name=max_cost]", "0.25")
    page.get_by_role("button", name="Start the session").click()
    page.wait_for_url(re.compile(r"/sessions/[0-9a-f-]{36}/$"))
    session = AgentSession.objects.get()
    assert page.url.endswith(f"/sessions/{session.id}/")
    assert session.agent == "echo" and session.created_by == users["operator"]
    assert "Started" in page.locator(".messages").inner_text()
    event = AuditEvent.objects.get(session=session, action=AuditAction.START)
    assert event.actor == users["operator"]
    assert event.request_meta["via"] == "dashboard"
    assert event.after["budgets"] == {"max_steps": 5, "max_cost": 0.25}
    assert console_errors(page, allow_http_errors=True) == []

    # From an agent's card, the form opens with that agent chosen.
    page.goto("/sessions/agents/")
    page.locator("#agent-demo a.start-agent").click()
    page.wait_for_url("**/sessions/new/?agent=demo")
    assert page.locator("select[name=agent]").input_value() == "demo"


def test_the_new_session_page_fits_a_phone(make_page, users):
    page = make_page(390, 800)
    login(page, "olivia", "pw-operator")
    page.goto("/sessions/new/")
    page.fill("textarea[name=input]", "x")
    page.fill("input[name=max_cost]", "a lot")
    page.get_by_role("button", name="Start the session").click()
    assert page.locator(".form-error[data-field=max_cost]").is_visible()
    screenshot(page, "new-session-phone")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390


def test_a_viewer_is_offered_no_new_session_and_is_refused_one(page, users, client):
    login(page, "victor", "pw-viewer")
    assert page.locator("#new-session-link").count() == 0
    page.goto("/sessions/agents/")
    assert page.locator("a.start-agent").count() == 0
    response = page.goto("/sessions/new/")
    assert response.status == 403
    client.force_login(users["viewer"])
    response = client.post("/sessions/new/", {"agent": "echo", "input": "hi"})
    assert response.status_code == 403
    assert not AgentSession.objects.exists()


def test_a_finished_session_shows_its_final_state_not_its_last_live_news(page, users, settings):
    settings.RESPAWN_SLOW_DELAY = 0  # the notification tool's pause
    demo = run_inline(session_start(agent="demo", input="what is (12*7)+3, then save it as a note"))
    notify = run_inline(session_start(agent="notify", input="tell ops the deploy finished"))
    migrate = run_inline(
        session_start(agent="migrate", input="migrate 30 records in batches of 10")
    )
    queued = session_start(agent="echo", input="not picked up yet")
    for session in (demo, notify, migrate):
        assert session.status == Status.COMPLETED, session.last_error
    # What the notification tool reported while it ran stays on the row.
    notify.refresh_from_db()
    assert notify.progress_note.startswith("sending")

    login(page, "olivia", "pw-operator")
    page.goto(f"/sessions/{demo.id}/")
    header = page.locator("#header")
    plan = header.locator(".plan-box").last
    assert "Plan, as the session left it" in plan.text_content()
    assert "in progress" not in plan.text_content()
    # The agent answered without ticking its last items off.
    assert "save the result as a note (not marked done)" in plan.inner_text()
    assert "compute (12*7)+3 (done)" in plan.inner_text()
    assert "state v–" not in header.inner_text()
    assert header.locator("#schema").inner_text() == "state v3"

    page.goto(f"/sessions/{notify.id}/")
    assert page.locator("#progress").count() == 0
    assert "sending" not in page.locator("#header").inner_text()

    # Batch work keeps its durable progress: every record, done.
    page.goto(f"/sessions/{migrate.id}/")
    assert "30 / 30 (100%)" in page.locator("#progress").inner_text()

    page.goto(f"/sessions/{queued.id}/")
    assert page.locator("#schema").count() == 0
    assert "v–" not in page.locator("#header").inner_text()
    assert console_errors(page) == []


def checkpoint_rows(page) -> list[tuple[int, str, str]]:
    """(seq, reason, marks) of each row of the checkpoints card."""
    return [
        (int(seq), reason, marks)
        for seq, reason, marks in page.locator("#checkpoints tbody tr").evaluate_all(
            """rows => rows.map(r => [r.dataset.seq, r.cells[1].innerText,
                [r.classList.contains('head') ? 'head' : '',
                 r.classList.contains('superseded') ? 'superseded' : ''].join(' ').trim()])"""
        )
    ]


def test_after_a_rollback_the_checkpoints_card_marks_the_head_and_what_was_superseded(page, users):
    session = run_inline(
        session_start(agent="demo", input="what is (12*7)+3, then save it as a note")
    )
    login(page, "olivia", "pw-operator")
    page.goto(f"/sessions/{session.id}/")
    page.evaluate("window.__noReload = true")
    assert checkpoint_rows(page) == [(7, "auto", ""), (12, "auto", ""), (13, "auto", "head")]

    page.locator("#step-7 button", has_text="roll back here").click()
    page.locator("#preview button", has_text="Confirm rollback").click()
    wait_for(lambda: page.locator("#status").inner_text() == "Paused", what="the rollback")
    # Redrawn in place, without a reload: the head is #7, what came after it superseded.
    wait_for(
        lambda: (
            checkpoint_rows(page)
            == [
                (7, "auto", "head"),
                (12, "auto", "superseded"),
                (13, "auto", "superseded"),
                (13, "before-rollback", "superseded"),
            ]
        ),
        what="the checkpoints card to be redrawn",
    )
    assert page.evaluate("window.__noReload") is True
    # The audit card too (its own request: it may land after the checkpoints card).
    wait_for(
        lambda: "rollback" in page.locator("#audit").inner_text(),
        what="the audit card to be redrawn",
    )

    # Every listed checkpoint leads to its step, a superseded one among the superseded steps.
    page.locator("#checkpoints tr[data-seq='12'] a").click()
    page.wait_for_url("**superseded=1**")
    step = page.locator("#step-12")
    assert step.is_visible()
    assert "superseded" in (step.get_attribute("class") or "")
    page.goto(f"/sessions/{session.id}/")
    page.locator("#checkpoints tr.head a").click()
    page.wait_for_url("**from=7**")
    assert page.locator("#step-7").is_visible()
    assert console_errors(page) == []


def test_the_head_is_listed_however_old_it_is(page, users):
    session = run_inline(session_start(agent="slow", input="count to 25"))
    first = Step.objects.filter(session=session, kind=Kind.TOOL_RESULT).order_by("seq").first()
    from sessions_app.services.core import checkpoint_rollback

    checkpoint_rollback(session_id=session.id, checkpoint_seq=first.seq)
    login(page, "olivia", "pw-operator")
    page.goto(f"/sessions/{session.id}/")
    rows = checkpoint_rows(page)
    assert len(rows) == 20
    assert rows[0] == (first.seq, "auto", "head")
    assert all(marks == "superseded" for _, _, marks in rows[1:])


def test_the_live_parts_keep_up_with_the_header_and_latest_means_now(page, users, start_worker):
    # About 30 steps a second: more than a page of the trace (50) between two polls (2 s).
    start_worker(RESPAWN_SLOW_DELAY="0.1")
    session = session_start(agent="slow", input="count to 400")
    wait_for(
        lambda: AgentSession.objects.get(id=session.id).last_seq > 20, timeout=30, what="the run"
    )
    login(page, "olivia", "pw-operator")
    page.goto(f"/sessions/{session.id}/")
    page.evaluate("window.__noReload = true")
    loaded_at = int(page.locator("#header").get_attribute("data-last-seq"))

    def shown() -> tuple[int, int, int]:
        """(header's last seq, trace's last seq, timeline's step count), as drawn now."""
        return page.evaluate(
            """() => {
                const steps = document.querySelectorAll('#trace-list > li.step');
                const sum = document.querySelector('#timeline .timeline-sum b');
                return [
                    +document.querySelector('#header').dataset.lastSeq,
                    steps.length ? +steps[steps.length - 1].dataset.seq : 0,
                    sum ? +sum.textContent.replace(/[^0-9]/g, '') : 0,
                ];
            }"""
        )

    # Each time the header moves on, the trace and the timeline follow within the same
    # poll: never a page or more behind it.
    for _ in range(4):
        header = shown()[0]
        wait_for(lambda h=header: shown()[0] > h, timeout=10, what="the header to move on")
        header = shown()[0]
        wait_for(
            lambda h=header: shown()[1] >= h and shown()[2] >= h,
            timeout=1.5,
            interval=0.05,
            what=f"the trace and timeline to reach the header's #{header}: {shown()}",
        )

    # "latest steps" goes to the tail as it is now, not as it was when the page loaded.
    assert AgentSession.objects.get(id=session.id).last_seq > loaded_at + 100
    page.locator("#trace a.latest").click()
    page.wait_for_url("**from=latest**")
    now = AgentSession.objects.get(id=session.id).last_seq
    first = int(page.locator("#trace-list > li.step").first.get_attribute("data-seq"))
    assert first > loaded_at + 50 and first >= now - 200
    assert page.evaluate("window.__noReload") is None  # a link followed: a new page
    assert console_errors(page) == []


def test_a_viewer_exports_a_session_with_the_export_button(page, users):
    """Export is a POST (an audited action), yet a click still downloads the file."""
    import gzip

    session = run_inline(session_start(agent="echo", input="hi"))
    login(page, "victor", "pw-viewer")
    page.goto(f"/sessions/{session.id}/")
    screenshot(page, "session-export-button", full_page=False)
    with page.expect_download() as download:
        page.locator("#export-link").click()
    path = download.value.path()
    assert download.value.suggested_filename == f"session-{session.id}.jsonl.gz"
    first = json.loads(gzip.decompress(open(path, "rb").read()).splitlines()[0])
    assert first["kind"] == "respawn-export"
    assert AuditEvent.objects.filter(session=session, action="export").count() == 1
    assert console_errors(page) == []
