"""RQ jobs: glue that builds the engine's pieces and calls it. A job carries only ids."""

from __future__ import annotations

import logging

from django.db import close_old_connections

from agent_runtime.loop import Outcome, RunResult, run_session

from . import dispatch
from .runtime import agent_registry, run_config
from .services import session_mark_incompatible
from .store import DjangoEffects, DjangoRecords, DjangoSessionStore

log = logging.getLogger("respawn.jobs")


def run_session_job(session_id: str) -> str:
    """Advance one session as far as it goes. Safe to run twice: the lease decides."""
    close_old_connections()
    result: RunResult = run_session(
        session_id,
        store=DjangoSessionStore(),
        agents=agent_registry(),
        effects=DjangoEffects(),
        config=run_config(),
        records=DjangoRecords(),
    )
    if result.outcome == Outcome.INCOMPATIBLE:
        # The run released the lease and wrote nothing; the mark keeps the reconciler from
        # dispatching the session again and again, and shows the reason in the dashboard.
        session_mark_incompatible(session_id=session_id, reason=result.error or "")
    log.info("session %s: %s", session_id, result.outcome)
    return result.outcome.value


def reconcile_job() -> list[str]:
    close_old_connections()
    return dispatch.reconcile()
