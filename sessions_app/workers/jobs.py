"""RQ jobs: glue that builds the engine's pieces and calls it. A job carries only ids."""

from __future__ import annotations

import logging

from django.db import close_old_connections

from agent_runtime.loop import BranchOutcome, Outcome, RunResult, run_branch, run_session

from ..runtime import agent_registry, run_config
from ..services import dispatch
from ..services.core import session_mark_incompatible
from ..store import DjangoEffects, DjangoRecords, session_store

log = logging.getLogger("respawn.jobs")


def run_session_job(session_id: str) -> str:
    """Advance one session as far as it goes. Safe to run twice: the lease decides."""
    close_old_connections()
    result: RunResult = run_session(
        session_id,
        store=session_store(),
        agents=agent_registry(),
        effects=DjangoEffects(),
        config=run_config(),
        records=DjangoRecords(),
    )
    if result.outcome == Outcome.FANNED_OUT:
        # The calls are committed (the fan_out step); their branches run on any worker.
        dispatch.enqueue_branches(session_id, result.branches)
    if result.outcome == Outcome.INCOMPATIBLE:
        # The run released the lease and wrote nothing; the mark keeps the reconciler from
        # dispatching the session again and again, and shows the reason in the dashboard.
        session_mark_incompatible(session_id=session_id, reason=result.error or "")
    log.info("session %s: %s", session_id, result.outcome)
    return result.outcome.value


def run_branch_job(session_id: str, seq: int) -> str:
    """Run one fan-out branch (the tool call at `seq`). Safe to run twice: a call gets one
    result, and the tool runs with the call's idempotency key."""
    close_old_connections()
    result = run_branch(
        session_id,
        seq,
        store=session_store(),
        agents=agent_registry(),
        effects=DjangoEffects(),
        config=run_config(),
        records=DjangoRecords(),
    )
    if result.branches:
        dispatch.enqueue_branches(session_id, result.branches)
    if result.outcome == BranchOutcome.JOINED:
        # This branch wrote the turn's last result and the join: exactly one does.
        dispatch.dispatch_now(session_id)
    log.info("session %s branch %s: %s", session_id, seq, result.outcome)
    return result.outcome.value


def reconcile_job() -> list[str]:
    close_old_connections()
    return dispatch.reconcile()
