"""DjangoSessionStore.load_tail beyond the shared contract: a run starts from the tail of
a long history, and what the tail leaves unread is still checked."""

from __future__ import annotations

import pytest
from django.utils import timezone

from agent_runtime.loop import Outcome, RunConfig, run_session
from agent_runtime.store import InMemoryEffects
from agent_runtime.upgraders import IncompatibleSchemaError
from demo_agents import demo_agents
from sessions_app.models import AgentSession, Step
from sessions_app.services.core import session_start
from sessions_app.store import session_store

from ..agent_runtime.helpers import Crash, CrashingStore

pytestmark = pytest.mark.django_db

AGENTS = demo_agents(slow_delay=0)


def _run(store, session_id):
    return run_session(
        str(session_id),
        store=store,
        agents=AGENTS,
        effects=InMemoryEffects(),
        config=RunConfig(worker_id="w1", lease_ttl=30, model_backoff=0.0),
    )


def _crashed_session(ticks: int = 6) -> AgentSession:
    """A slow-agent session whose run died mid-way, its lease expired: ready to resume.
    (Not a transactional test: the session's dispatch on commit never happens.)"""
    session = session_start(agent="slow", input=f"count to {ticks}")
    try:
        _run(CrashingStore(session_store(), at_seq=2 * ticks + 1, after_commit=True), session.id)
    except Crash:
        pass
    AgentSession.objects.filter(id=session.id).update(lease_expires_at=timezone.now())
    session.refresh_from_db()
    return session


def test_the_tail_is_the_live_history_from_where_it_starts():
    session = _crashed_session()
    store = session_store()
    head, tail = store.load_head(str(session.id)), store.load_tail(str(session.id))
    assert 1 < tail.history_from <= head.last_seq
    assert tail.history == [s for s in head.history if s.seq >= tail.history_from]
    assert tail.step_versions == head.step_versions


def test_a_malformed_step_before_the_tail_stops_the_run_as_incompatible():
    """It is found when the model's conversation is loaded: the run ends there, releases
    the lease and writes nothing after its run_started step."""
    session = _crashed_session()
    Step.objects.filter(session=session, seq=1).update(payload={"content": 5})
    last_seq = session.last_seq
    result = _run(session_store(), session.id)
    assert result.outcome == Outcome.INCOMPATIBLE, result
    assert "user step payload" in result.error, result.error
    session.refresh_from_db()
    assert session.lease_owner is None
    new = list(
        Step.objects.filter(session=session, seq__gt=last_seq)
        .order_by("seq")
        .values_list("kind", "payload__event")
    )
    assert new[0] == ("system", "run_started")
    assert "model" not in [kind for kind, _ in new], "the model was never called"


def test_a_step_newer_than_the_code_before_the_tail_is_refused_before_anything_is_written():
    session = _crashed_session()
    Step.objects.filter(session=session, seq=1).update(schema_version=99)
    with pytest.raises(IncompatibleSchemaError, match="step seq 1"):
        session_store().load_tail(str(session.id))
    last_seq = session.last_seq
    result = _run(session_store(), session.id)
    assert result.outcome == Outcome.INCOMPATIBLE
    session.refresh_from_db()
    assert session.last_seq == last_seq, "nothing written"
