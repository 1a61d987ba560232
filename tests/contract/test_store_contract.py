"""One contract, two stores: the in-memory store and the Django store behave the same. `make
test` runs it twice: on PostgreSQL (the store's single-statement path) and on SQLite (the
portable path `make run` uses)."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest

from agent_runtime.state import (
    SCHEMA_VERSION,
    NewCheckpoint,
    NewStep,
    SessionState,
    SessionStatus,
    StepKind,
    model_payload,
    step_text,
    user_payload,
)
from agent_runtime.store import InMemoryStore, LeaseLost, SessionNotFound


class MemoryHarness:
    def __init__(self):
        self.store = InMemoryStore()

    def create(self, agent="echo", text="hi") -> str:
        session_id = f"m-{uuid.uuid4().hex[:8]}"
        self.store.create_session(session_id, agent, text)
        return session_id

    def expire(self, session_id):
        self.store.expire_lease(session_id)

    def set_status(self, session_id, status):
        self.store.session(session_id).status = status

    def supersede_after(self, session_id, seq):
        from dataclasses import replace

        s = self.store.session(session_id)
        s.steps = [replace(x, superseded=True) if x.seq > seq else x for x in s.steps]

    def request_cancel(self, session_id):
        self.store.request_cancel(session_id)


class DjangoHarness:
    def __init__(self):
        from sessions_app.store import session_store

        self.store = session_store()

    def create(self, agent="echo", text="hi") -> str:
        from sessions_app.models import AgentSession, Step

        session = AgentSession.objects.create(agent=agent, last_seq=1, step_count=1)
        Step.objects.create(session=session, seq=1, kind="user", payload=user_payload(text))
        return str(session.id)

    def expire(self, session_id):
        from django.utils import timezone

        from sessions_app.models import AgentSession

        AgentSession.objects.filter(id=session_id).update(
            lease_expires_at=timezone.now() - timedelta(seconds=1)
        )

    def set_status(self, session_id, status):
        from sessions_app.models import AgentSession

        AgentSession.objects.filter(id=session_id).update(status=status)

    def supersede_after(self, session_id, seq):
        from django.utils import timezone

        from sessions_app.models import Step

        Step.objects.filter(session_id=session_id, seq__gt=seq).update(superseded_at=timezone.now())

    def request_cancel(self, session_id):
        from sessions_app.models import AgentSession

        AgentSession.objects.filter(id=session_id).update(cancel_requested=True)


# The mark (not just the `db` fixture) tells pytest-django at collection time that this
# run needs the test database; without it, running only tests/contract (or with
# tests/agent_runtime) would talk to the un-migrated main database.
@pytest.fixture(params=["memory", pytest.param("django", marks=pytest.mark.django_db)])
def harness(request):
    if request.param == "memory":
        return MemoryHarness()
    return DjangoHarness()


def state() -> SessionState:
    return SessionState(agent_name="echo", agent_version="1")


def model_step(text="ok") -> NewStep:
    return NewStep(
        kind=StepKind.MODEL,
        payload=model_payload(text, [], {}, "scripted:echo"),
        tokens_in=3,
        tokens_out=2,
    )


def test_claim_is_exclusive_until_the_lease_expires(harness):
    sid = harness.create()
    first = harness.store.claim(sid, "a", ttl=30)
    assert first is not None and first.token == 1
    assert harness.store.claim(sid, "b", ttl=30) is None
    harness.expire(sid)
    second = harness.store.claim(sid, "b", ttl=30)
    assert second is not None and second.token == 2
    assert harness.store.load_head(sid).status == SessionStatus.RUNNING


def test_claim_refuses_sessions_that_are_not_runnable(harness):
    sid = harness.create()
    for status in ("paused", "waiting_input", "completed", "failed", "cancelled"):
        harness.set_status(sid, status)
        assert harness.store.claim(sid, "a", ttl=30) is None, status


def test_claim_of_missing_session_raises(harness):
    missing = str(uuid.uuid4())
    with pytest.raises(SessionNotFound):
        harness.store.claim(missing, "a", ttl=30)


def test_loads_of_a_missing_session_raise(harness):
    """load_history too, though a session's history may be empty: an unknown id is not a
    session without steps."""
    missing = str(uuid.uuid4())
    for load in (harness.store.load_head, harness.store.load_tail, harness.store.load_history):
        with pytest.raises(SessionNotFound):
            load(missing)


def test_append_assigns_contiguous_seqs_and_checkpoint_sets_head(harness):
    sid = harness.create()
    lease = harness.store.claim(sid, "a", ttl=30)
    r1 = harness.store.append(lease, [NewStep(kind=StepKind.SYSTEM, payload={"event": "x"})])
    r2 = harness.store.append(lease, [model_step()], checkpoint=NewCheckpoint(state=state()))
    assert r1.seqs == [2] and r2.seqs == [3]
    head = harness.store.load_head(sid)
    assert head.head_seq == 3 and head.last_seq == 3
    assert head.checkpoint.seq == 3 and head.checkpoint.state.agent_name == "echo"
    assert [s.seq for s in head.history] == [1, 2, 3]
    assert head.steps_after_checkpoint == []
    assert head.history[2].tokens_in == 3


def test_append_with_status_and_release_frees_the_lease(harness):
    sid = harness.create()
    lease = harness.store.claim(sid, "a", ttl=30)
    harness.store.append(
        lease,
        [model_step()],
        checkpoint=NewCheckpoint(state=state()),
        status=SessionStatus.COMPLETED,
        release=True,
    )
    assert harness.store.load_head(sid).status == SessionStatus.COMPLETED
    with pytest.raises(LeaseLost):
        harness.store.append(lease, [model_step()])


def test_fenced_off_writer_cannot_append(harness):
    sid = harness.create()
    old = harness.store.claim(sid, "a", ttl=30)
    harness.expire(sid)
    new = harness.store.claim(sid, "b", ttl=30)
    with pytest.raises(LeaseLost):
        harness.store.append(old, [model_step("late")])
    harness.store.append(new, [model_step("current")])
    texts = [step_text(s.payload) for s in harness.store.load_head(sid).history]
    assert texts == ["hi", "current"]


def test_heartbeat_extends_the_lease_and_reports_loss(harness):
    sid = harness.create()
    lease = harness.store.claim(sid, "a", ttl=0.5)
    assert harness.store.heartbeat(lease, ttl=30).alive
    time.sleep(0.6)
    # Extended: still ours after the first TTL would have run out.
    assert harness.store.claim(sid, "b", ttl=30) is None
    harness.expire(sid)
    assert harness.store.claim(sid, "b", ttl=30) is not None
    assert harness.store.heartbeat(lease, ttl=30).alive is False


def test_heartbeat_and_append_report_a_cancel_request(harness):
    sid = harness.create()
    lease = harness.store.claim(sid, "a", ttl=30)
    assert harness.store.heartbeat(lease, ttl=30).cancel_requested is False
    harness.request_cancel(sid)
    assert harness.store.heartbeat(lease, ttl=30).cancel_requested is True
    assert harness.store.append(lease, [model_step()]).cancel_requested is True


def test_release_frees_the_lease_for_another_worker(harness):
    sid = harness.create()
    lease = harness.store.claim(sid, "a", ttl=30)
    assert harness.store.release(lease) is True
    assert harness.store.claim(sid, "b", ttl=30) is not None
    assert harness.store.release(lease) is False


def test_history_leaves_out_superseded_steps(harness):
    sid = harness.create()
    lease = harness.store.claim(sid, "a", ttl=30)
    harness.store.append(lease, [model_step("one")], checkpoint=NewCheckpoint(state=state()))
    harness.store.append(lease, [model_step("two")])
    harness.supersede_after(sid, 2)
    texts = [step_text(s.payload) for s in harness.store.load_head(sid).history]
    assert texts == ["hi", "one"]


def test_load_head_upgrades_and_refuses_newer_state(harness):
    from agent_runtime.upgraders import IncompatibleSchemaError, load_state

    blob = state().to_dict()
    assert load_state(blob).value == state()
    with pytest.raises(IncompatibleSchemaError, match="newer than this code"):
        load_state({**blob, "schema_version": 99})
    sid = harness.create()
    assert harness.store.load_head(sid).checkpoint is None


def test_claim_counts_takeovers_in_a_row_without_progress(harness):
    sid = harness.create()
    assert harness.store.claim(sid, "a", ttl=30).crashes == 0
    harness.expire(sid)
    assert harness.store.claim(sid, "b", ttl=30).crashes == 1
    harness.expire(sid)
    lease = harness.store.claim(sid, "c", ttl=30)
    assert lease.crashes == 2
    harness.store.append(lease, [model_step(), model_step()])  # progress beyond run_started
    harness.expire(sid)
    lease = harness.store.claim(sid, "d", ttl=30)
    assert lease.crashes == 1
    harness.store.release(lease)  # a clean stop
    assert harness.store.claim(sid, "e", ttl=30).crashes == 0


def test_a_run_that_comes_back_after_a_takeover_takes_its_crash_back(harness):
    """A run stopped past its TTL and taken over was not a crash: once it comes back (and
    finds itself fenced off) the takeover's count is taken back. Nothing else is: a lease
    fenced later, or one that nobody took over, changes nothing."""
    sid = harness.create()
    first = harness.store.claim(sid, "a", ttl=30)
    harness.expire(sid)
    second = harness.store.claim(sid, "b", ttl=30)
    assert second.crashes == 1
    assert harness.store.came_back(second) is False  # b still holds it: nothing to take back
    assert harness.store.came_back(first) is True
    assert harness.store.came_back(first) is False  # once
    harness.expire(sid)
    third = harness.store.claim(sid, "c", ttl=30)
    assert third.crashes == 1  # b's takeover, and only it, counts
    assert harness.store.came_back(first) is False  # not the takeover right after a's lease
    harness.expire(sid)
    assert harness.store.claim(sid, "d", ttl=30).crashes == 2  # b never came back


def test_load_tail_starts_at_the_last_model_step_or_after_the_head_checkpoint(harness):
    """What a run starts from: the live steps from the last model step on, or from just
    after the head checkpoint when that is earlier; the version counts are still those
    of every live step; load_history is load_head's whole history."""
    sid = harness.create()
    store = harness.store
    assert store.load_tail(sid).history_from == 1  # no model step yet: everything
    assert store.load_tail(sid).history == store.load_head(sid).history
    lease = store.claim(sid, "a", ttl=30)
    system = NewStep(kind=StepKind.SYSTEM, payload={"event": "x"})
    store.append(lease, [model_step("one"), system], checkpoint=NewCheckpoint(state=state()))
    store.append(lease, [system, model_step("two"), system])  # seqs 4-6
    head, tail = store.load_head(sid), store.load_tail(sid)
    assert head.head_seq == 3 and head.history_from == 1
    assert tail.history_from == 4  # just after the checkpoint, before the last model (5)
    assert tail.history == [s for s in head.history if s.seq >= 4]
    assert tail.steps_after_checkpoint == head.steps_after_checkpoint
    assert tail.step_versions == head.step_versions == {SCHEMA_VERSION: 6}
    assert (tail.checkpoint, tail.last_seq, tail.head_seq) == (
        head.checkpoint,
        head.last_seq,
        head.head_seq,
    )
    store.append(lease, [model_step("three")], checkpoint=NewCheckpoint(state=state()))
    tail = store.load_tail(sid)
    assert tail.history_from == 7 and [s.seq for s in tail.history] == [7]  # the last model
    assert store.load_history(sid) == store.load_head(sid).history
    assert [s.seq for s in store.load_history(sid)] == list(range(1, 8))
    # A rollback supersedes steps: they are neither in the tail nor counted.
    harness.supersede_after(sid, 5)
    head, tail = store.load_head(sid), store.load_tail(sid)
    assert [s.seq for s in head.history] == [1, 2, 3, 4, 5]
    assert tail.history == [s for s in head.history if s.seq >= tail.history_from]
    assert tail.step_versions == head.step_versions == {SCHEMA_VERSION: 5}
