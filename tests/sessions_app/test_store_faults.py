"""The database failing under a run is not the session's fault and not a crash: the run
releases its lease (retrying while the database keeps failing), and the next dispatch runs
the session from where it was. Against the real PostgreSQL: a write that waits on a table
lock past the statement timeout, as a full disk or a long lock makes every append fail."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection

from agent_runtime.loop import Outcome
from sessions_app.models import AgentSession, Status, Step
from sessions_app.services.core import session_start

from ..conftest import database_url, run_session_inline

pytestmark = pytest.mark.django_db(transaction=True)


def _statement_timeout(ms: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"SET statement_timeout = {ms}")


def test_a_write_the_database_refuses_releases_the_lease_and_counts_no_crash():
    session = session_start(agent="echo", input="hi")
    holder = psycopg.connect(database_url())
    # Inserts into the step table wait on this lock; reads go on.
    holder.execute(f"LOCK TABLE {Step._meta.db_table} IN SHARE MODE")
    _statement_timeout(500)
    try:
        for _ in range(6):  # more runs than it takes to call a session a poison one
            result = run_session_inline(session)
            assert result.outcome == Outcome.STORE_FAULT, result
            assert "statement timeout" in (result.error or "")
    finally:
        _statement_timeout(0)
        holder.rollback()
        holder.close()
    row = AgentSession.objects.get(id=session.id)
    assert row.lease_owner is None and row.crash_count == 0
    assert row.status in (Status.QUEUED, Status.RUNNING)
    # The database works again: the next run completes the session.
    assert run_session_inline(session).outcome == Outcome.COMPLETED
    assert AgentSession.objects.get(id=session.id).status == Status.COMPLETED
