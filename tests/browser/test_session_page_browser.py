"""The session page as support staff use it: deciding an uncertain call, correcting a
tool result, rolling back, reading a finished or a running session, starting one."""

from __future__ import annotations

import json

import pytest

from agent_runtime.state import OperatorAction
from sessions_app.dashboard.actions import ACTIONS
from sessions_app.models import AgentSession, Kind, Status, Step
from sessions_app.services.core import session_start

from ..conftest import run_inline, wait_for
from ..sessions_app.test_dashboard import _uncertain_notify_session
from .conftest import console_errors, login

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
