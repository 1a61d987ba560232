"""DjangoSessionStore.append beyond the shared contract: one statement, all or nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from agent_runtime.state import (
    NewCheckpoint,
    NewStep,
    SessionState,
    SessionStatus,
    StepKind,
    user_payload,
)
from agent_runtime.store import LeaseLost
from sessions_app.models import AgentSession, Checkpoint, Step
from sessions_app.store import session_store

pytestmark = pytest.mark.django_db


def _session() -> str:
    session = AgentSession.objects.create(agent="echo", last_seq=1, step_count=1)
    Step.objects.create(session=session, seq=1, kind="user", payload=user_payload("hi"))
    return str(session.id)


def _step(event: str = "x") -> NewStep:
    return NewStep(kind=StepKind.SYSTEM, payload={"event": event})


def _state() -> SessionState:
    return SessionState(agent_name="echo", agent_version="1")


def test_a_fenced_off_append_writes_neither_step_nor_checkpoint():
    store = session_store()
    sid = _session()
    old = store.claim(sid, "a", ttl=30)
    AgentSession.objects.filter(id=sid).update(lease_expires_at=timezone.now() - timedelta(1))
    store.claim(sid, "b", ttl=30)
    with pytest.raises(LeaseLost):
        store.append(old, [_step()], checkpoint=NewCheckpoint(state=_state()))
    assert Step.objects.filter(session_id=sid).count() == 1
    assert not Checkpoint.objects.filter(session_id=sid).exists()
    assert AgentSession.objects.get(id=sid).last_seq == 1


def test_append_inside_a_transaction_is_undone_with_it():
    store = session_store()
    sid = _session()
    lease = store.claim(sid, "a", ttl=30)
    with pytest.raises(RuntimeError), transaction.atomic():
        store.append(lease, [_step()], checkpoint=NewCheckpoint(state=_state()))
        assert Step.objects.filter(session_id=sid).count() == 2
        raise RuntimeError("roll back")
    assert Step.objects.filter(session_id=sid).count() == 1
    assert not Checkpoint.objects.filter(session_id=sid).exists()
    assert store.append(lease, [_step()]).seqs == [2]


def test_several_steps_and_a_checkpoint_in_one_append():
    store = session_store()
    sid = _session()
    lease = store.claim(sid, "a", ttl=30)
    steps = [_step("one"), NewStep(kind=StepKind.SYSTEM, payload={"event": "two"}, tokens_in=4)]
    result = store.append(lease, steps, checkpoint=NewCheckpoint(state=_state()))
    assert result.seqs == [2, 3]
    session = AgentSession.objects.get(id=sid)
    assert (session.last_seq, session.head, session.step_count, session.tokens_in) == (3, 3, 3, 4)
    assert list(Step.objects.filter(session_id=sid).values_list("seq", "payload__event")) == [
        (1, None),
        (2, "one"),
        (3, "two"),
    ]
    assert Checkpoint.objects.get(session_id=sid).seq == 3


def test_updated_at_moves_at_most_once_a_second_within_a_run_and_on_every_status_change():
    store = session_store()
    sid = _session()
    lease = store.claim(sid, "a", ttl=30)
    claimed_at = AgentSession.objects.get(id=sid).updated_at
    store.append(lease, [_step()])
    assert AgentSession.objects.get(id=sid).updated_at == claimed_at  # within the second
    AgentSession.objects.filter(id=sid).update(updated_at=claimed_at - timedelta(seconds=2))
    store.append(lease, [_step()])
    moved = AgentSession.objects.get(id=sid).updated_at
    assert moved > claimed_at
    store.append(lease, [_step()], status=SessionStatus.COMPLETED, release=True)
    assert AgentSession.objects.get(id=sid).updated_at > moved
