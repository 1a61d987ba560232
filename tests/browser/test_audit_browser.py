"""The audit log as an operator reads it: a session found by the start of its id, a
filter that cannot apply shows nothing (never every row), details in words, and what was
done from the command line says so, with the system user who did it."""

from __future__ import annotations

import getpass
import re

import pytest
from django.core.management import call_command

from sessions_app.models import AgentSession
from sessions_app.services.core import session_start

from ..conftest import wait_for
from .conftest import console_errors, login, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def rows(page) -> list[str]:
    return page.locator("table.audit-log tbody tr").all_inner_texts()


def test_audit_log_prefix_details_and_the_command_line(page, users, capsys):
    call_command("start_session", agent="echo", input="from the shell", title="from the shell")
    from_cli = AgentSession.objects.get(title="from the shell")
    other = session_start(agent="echo", input="from elsewhere", actor=users["operator"])
    while str(other.id)[:6] == str(from_cli.id)[:6]:  # one in 16 million
        other = session_start(agent="echo", input="from elsewhere", actor=users["operator"])
    login(page, "olivia", "pw-operator")

    # Cancel from the dashboard: a record with a before and an after.
    page.goto(f"/sessions/{other.id}/")
    page.accept_dialogs = True
    page.locator("form[action$='/actions/cancel/'] button[type=submit]").click()
    wait_for(lambda: AgentSession.objects.get(id=other.id).status == "cancelled", what="the cancel")

    page.goto("/audit/")
    assert len(rows(page)) == 3
    # The start of an id, as copied from a list or a log line, finds that session's records.
    page.fill("input[name=session]", str(from_cli.id)[:8])
    page.click("form.filters button[type=submit]")
    page.wait_for_url(re.compile(r"session="))
    texts = rows(page)
    assert len(texts) == 1 and "start" in texts[0]
    # Started from the command line: through the CLI, by the system user who ran it.
    via = page.locator("table.audit-log tbody td[data-label=Via]").inner_text()
    assert via == f"cli: start_session, by {getpass.getuser()}"
    screenshot(page, "audit-prefix")

    # A filter that cannot apply says why and shows no rows at all.
    for bad, said in (("zz-not-hex", "is not a session id"), ("ab", "too short")):
        response = page.goto(f"/audit/?session={bad}")
        assert response is not None and response.status == 400
        assert said in page.locator("p.error").inner_text()
        assert rows(page) == ["No rows: the filter above cannot apply."]

    # Details in words: key and value, the change as before → after, no dict dump.
    page.goto(f"/audit/?session={other.id}&action=cancel")
    assert len(rows(page)) == 1
    page.locator("td.change summary").click()
    details = page.locator("td.change dl.kv")
    assert details.is_visible()
    pairs = dict(
        zip(
            details.locator("dt").all_inner_texts(),
            details.locator("dd").all_inner_texts(),
            strict=True,
        )
    )
    assert pairs["status"] == "queued → cancelled"
    assert pairs["fencing_token"].endswith(
        "→ " + str(AgentSession.objects.get(id=other.id).fencing_token)
    )
    assert "{" not in details.inner_text() and "'" not in details.inner_text()
    assert page.locator("td[data-label=Via]").inner_text() == "dashboard"
    screenshot(page, "audit-details")
    assert console_errors(page, allow_http_errors=True) == []
