"""Frozen v1 sessions and a v99 one against real rqworker processes."""

from __future__ import annotations

import time
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from agent_runtime.state import SCHEMA_VERSION
from sessions_app.models import AgentSession, Checkpoint, SideEffect, Status, Step
from sessions_app.services.core import session_approve, session_resume
from sessions_app.services.dispatch import reconcile
from tests.fixtures.loader import dump_blobs, insert_fixture, read_fixture

from ..conftest import wait_for, wait_for_status, wait_stopped
from ..sessions_app.test_state_upgrade import make_v99
from .test_workers import assert_consistent

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_v1_sessions_upgraded_then_resumed_to_completed_by_a_real_worker(start_worker):
    mid_run = AgentSession.objects.get(id=insert_fixture("mid_run"))
    waiting = AgentSession.objects.get(id=insert_fixture("waiting_approval"))
    call_command("upgrade_state", stdout=StringIO(), stderr=StringIO())
    assert set(Step.objects.values_list("schema_version", flat=True)) == {SCHEMA_VERSION}

    start_worker()
    # Nobody dispatches the crashed run: the worker's reconciler finds it (lease expired).
    wait_stopped(mid_run, timeout=30)
    assert mid_run.status == Status.COMPLETED
    assert mid_run.final_answer == f"(12*7)+3 = 87. Saved as note note-{mid_run.id}-call_1_1."
    assert mid_run.fencing_token == 2 and mid_run.lease_owner is None
    assert SideEffect.objects.filter(session_id=mid_run.id, tool="save_note").count() == 1
    assert_consistent(mid_run)

    session_approve(session_id=waiting.id)
    wait_for_status(waiting, Status.COMPLETED, timeout=30)
    assert waiting.final_answer == f"Payment sent: reference pay-{waiting.id}-call_0_0."
    assert SideEffect.objects.filter(session_id=waiting.id, tool="send_payment").count() == 1
    assert_consistent(waiting)


def test_worker_refuses_a_v99_session_writes_nothing_and_leaves_it_alone(start_worker, settings):
    session_id = insert_fixture("mid_run")
    make_v99(session_id)
    before = dump_blobs()
    start_worker()

    def marked():
        return AgentSession.objects.filter(id=session_id, incompatible_at__isnull=False).first()

    session = wait_for(marked, timeout=30, what="the worker to refuse the v99 session")
    assert session.incompatible_reason.startswith(
        "checkpoint at seq 7: checkpoint state was written by schema version 99"
    )
    assert session.fencing_token == 2  # claimed once, by the run that refused it
    assert session.lease_owner is None and session.last_seq == 11

    # Several reconciler passes later it has not been dispatched (claimed) again.
    time.sleep(settings.RESPAWN_RECONCILE_INTERVAL * 4 + 0.5)
    session.refresh_from_db()
    assert session.fencing_token == 2
    assert reconcile() == []
    assert dump_blobs() == before  # not a byte of its steps or checkpoints changed

    with pytest.raises(CommandError) as gate:
        call_command("check_state_compat", stdout=(out := StringIO()))
    assert gate.value.returncode == 1 and f"FAIL {session_id}" in out.getvalue()

    # Someone puts the blob right (a newer release would load it as it is) and resumes it.
    v1 = read_fixture("mid_run")["checkpoints"][0]["state"]
    Checkpoint.objects.filter(session_id=session_id, seq=7).update(state=v1, schema_version=1)
    session_resume(session_id=session_id)
    wait_stopped(session, timeout=30)
    assert session.status == Status.COMPLETED and not session.is_incompatible
    assert_consistent(session)
