"""Fan-out: the calls of one model turn run as branches, their results join the session
once, fenced like any write; a lost or crashing branch is run again, then given up."""

from __future__ import annotations

import threading

import pytest

from agent_runtime.loop import BranchOutcome, Outcome, RunConfig, run_branch
from agent_runtime.store import InMemoryEffects, InMemoryStore
from demo_agents import demo_agents

from .helpers import new_session
from .helpers import run as plain_run

AGENTS = demo_agents(slow_delay=0, research_delay=0, research_parallel=3)
CONFIG = RunConfig(worker_id="b", lease_ttl=30, model_backoff=0.0)


def branch(store, session_id, seq, **kwargs):
    return run_branch(
        session_id,
        seq,
        store=store,
        agents=AGENTS,
        effects=InMemoryEffects(),
        config=CONFIG,
        **kwargs,
    )


def drive(store, session_id, *, order=None, result=None):
    """Run the session, its branches (waves included) and the run after the join."""
    result = result or plain_run(store, session_id, agents=AGENTS)
    outcomes = []
    while result.outcome == Outcome.FANNED_OUT:
        queue = list(result.branches)
        joined = 0
        while queue:
            seq = queue.pop(order(queue) if order else 0)
            done = branch(store, session_id, seq)
            outcomes.append(done.outcome)
            queue.extend(done.branches)
            joined += done.outcome == BranchOutcome.JOINED
        assert joined == 1
        result = plain_run(store, session_id, agents=AGENTS)
    return result, outcomes


def steps(store, session_id, kind=None, event=None):
    return [
        s
        for s in store.session(session_id).steps
        if (kind is None or s.kind == kind) and (event is None or s.payload.get("event") == event)
    ]


def test_research_fans_out_joins_once_and_summarises():
    store = InMemoryStore()
    session_id = new_session(store, "research", "research checkpoints in 8 sources")
    result, outcomes = drive(store, session_id)
    assert result.outcome == Outcome.COMPLETED
    assert result.final_answer.startswith("checkpoints: ")
    assert "in 8 sources" not in result.final_answer  # a summary, not the question
    assert outcomes.count(BranchOutcome.JOINED) == 1
    assert outcomes.count(BranchOutcome.RECORDED) == 7
    calls = steps(store, session_id, "tool_call")
    results = steps(store, session_id, "tool_result")
    assert len(calls) == 8 and len(results) == 8
    # All calls recorded in one append, before any result; keys are session:seq.
    assert [c.seq for c in calls] == list(range(calls[0].seq, calls[0].seq + 8))
    assert all(c.idempotency_key == f"{session_id}:{c.seq}" for c in calls)
    assert min(r.seq for r in results) > calls[-1].seq
    assert len(steps(store, session_id, "system", "fan_out")) == 1
    assert len(steps(store, session_id, "system", "joined")) == 1
    assert len(steps(store, session_id, "model")) == 2
    # The join checkpointed the turn, and gave the lease back.
    joined = steps(store, session_id, "system", "joined")[0]
    assert any(c.seq == joined.seq for c in store.session(session_id).checkpoints)


def test_results_land_in_any_order_and_the_trace_reads_the_same():
    a, b = InMemoryStore(), InMemoryStore()
    sa = new_session(a, "research", "research leases in 6 sources")
    sb = new_session(b, "research", "research leases in 6 sources")
    ra, _ = drive(a, sa)
    rb, _ = drive(b, sb, order=lambda queue: len(queue) - 1)
    assert ra.final_answer == rb.final_answer


def test_a_second_branch_for_the_same_call_writes_nothing():
    store = InMemoryStore()
    session_id = new_session(store, "research", "research queues in 4 sources")
    result = plain_run(store, session_id, agents=AGENTS)
    seq = result.branches[0]
    assert branch(store, session_id, seq).outcome == BranchOutcome.RECORDED
    assert branch(store, session_id, seq).outcome == BranchOutcome.NOT_NEEDED
    assert len(steps(store, session_id, "tool_result")) == 1


def test_the_limit_holds_back_the_rest_until_a_slot_frees():
    store = InMemoryStore()
    session_id = new_session(store, "research", "research retries in 5 sources")
    result = plain_run(store, session_id, agents=AGENTS)
    assert len(result.branches) == 3  # research_parallel=3
    calls = [c.seq for c in steps(store, session_id, "tool_call")]
    assert list(result.branches) == calls[:3]
    first = branch(store, session_id, calls[0])
    assert first.branches == (calls[3],)
    second = branch(store, session_id, calls[1])
    assert second.branches == (calls[4],)


def test_racing_last_results_join_exactly_once():
    store = InMemoryStore()
    session_id = new_session(store, "research", "research fencing in 8 sources")
    result = plain_run(
        store, session_id, agents=demo_agents(research_delay=0.05, research_parallel=8)
    )
    barrier = threading.Barrier(len(result.branches))
    outcomes = []

    def go(seq):
        barrier.wait()
        outcomes.append(branch(store, session_id, seq).outcome)

    threads = [threading.Thread(target=go, args=(s,)) for s in result.branches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count(BranchOutcome.JOINED) == 1
    assert len(steps(store, session_id, "system", "joined")) == 1
    assert plain_run(store, session_id, agents=AGENTS).outcome == Outcome.COMPLETED


def test_a_branch_running_when_a_new_wave_starts_is_fenced_off(monkeypatch):
    store = InMemoryStore()
    session_id = new_session(store, "research", "research backups in 3 sources")
    first = plain_run(store, session_id, agents=AGENTS)
    real_append = store.append_branch_result

    def new_wave_meanwhile(lease, step, **kwargs):
        store.expire_lease(session_id)
        assert plain_run(store, session_id, agents=AGENTS).outcome == Outcome.FANNED_OUT
        return real_append(lease, step, **kwargs)

    monkeypatch.setattr(store, "append_branch_result", new_wave_meanwhile)
    assert branch(store, session_id, first.branches[0]).outcome == BranchOutcome.FENCED
    assert not steps(store, session_id, "tool_result")


def test_a_rollback_or_cancel_fences_late_branches_off():
    store = InMemoryStore()
    session_id = new_session(store, "research", "research sagas in 3 sources")
    result = plain_run(store, session_id, agents=AGENTS)
    store.add_operator_step(session_id, {"action": "cancel", "actor": "op"})
    assert branch(store, session_id, result.branches[0]).outcome == BranchOutcome.FENCED
    assert not steps(store, session_id, "tool_result")


def test_one_lost_branch_is_run_by_the_next_run_itself():
    store = InMemoryStore()
    session_id = new_session(store, "research", "research outbox in 3 sources")
    first = plain_run(store, session_id, agents=AGENTS)
    for seq in first.branches[:2]:
        branch(store, session_id, seq)
    store.expire_lease(session_id)
    again = plain_run(store, session_id, agents=AGENTS)
    assert again.outcome == Outcome.COMPLETED
    results = steps(store, session_id, "tool_result")
    assert sorted(r.payload["call_id"] for r in results) == ["call_0_0", "call_0_1", "call_0_2"]
    assert branch(store, session_id, first.branches[2]).outcome == BranchOutcome.NOT_NEEDED


@pytest.mark.parametrize("lost", [2, 3])
def test_lost_branches_are_fanned_out_again_by_the_next_run(lost):
    store = InMemoryStore()
    session_id = new_session(store, "research", "research outbox in 3 sources")
    first = plain_run(store, session_id, agents=AGENTS)
    # Only the first branches ran; the others were lost with Redis. The lease expires.
    for seq in first.branches[: 3 - lost]:
        branch(store, session_id, seq)
    store.expire_lease(session_id)
    again = plain_run(store, session_id, agents=AGENTS)
    assert again.outcome == Outcome.FANNED_OUT
    assert len(again.branches) == lost
    # A job of the old wave that starts only now works under the new fan-out (it carries
    # only ids); its twin from the new wave then finds the call answered.
    old = branch(store, session_id, first.branches[-1])
    assert old.outcome == BranchOutcome.RECORDED
    result, _ = drive(store, session_id, result=again)
    assert result.outcome == Outcome.COMPLETED
    assert len(steps(store, session_id, "tool_result")) == 3
    assert len(steps(store, session_id, "system", "joined")) == 1


def test_a_branch_whose_worker_keeps_dying_becomes_an_error_result():
    store = InMemoryStore()
    session_id = new_session(store, "research", "research timeouts in 2 sources")
    result = plain_run(store, session_id, agents=AGENTS)
    for _ in range(CONFIG.max_branch_attempts - 1):
        store.expire_lease(session_id)
        result = plain_run(store, session_id, agents=AGENTS)
        assert result.outcome == Outcome.FANNED_OUT
    store.expire_lease(session_id)
    result = plain_run(store, session_id, agents=AGENTS)
    assert result.outcome == Outcome.COMPLETED
    errors = [r for r in steps(store, session_id, "tool_result") if r.payload["status"] == "error"]
    assert len(errors) == 2
    assert "2 lookup(s) failed" in result.final_answer


def test_sequential_agents_do_not_fan_out():
    store = InMemoryStore()
    session_id = new_session(store, "demo", "what is 2+2")
    result = plain_run(store, session_id, agents=AGENTS)
    assert result.outcome == Outcome.COMPLETED
    assert not steps(store, session_id, "system", "fan_out")


class FirstLoadFrom:
    """A store whose first load_head answers with a head read earlier: a branch job that
    read the session just before another copy of it joined the turn."""

    def __init__(self, inner: InMemoryStore, head) -> None:
        self.inner = inner
        self.head = head

    def load_head(self, session_id):
        head, self.head = self.head, None
        return head if head is not None else self.inner.load_head(session_id)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_duplicate_branch_that_finds_the_turn_joined_is_not_needed_not_fenced():
    """The race test_racing_branches_record_each_result_once_and_join_once lost now and
    then: a branch job run twice reads the session, the other copy records the last result
    and joins (releasing the fan-out's lease), and the duplicate then finds the lease gone.
    Its call was answered, nothing fenced it off: not needed."""
    store = InMemoryStore()
    session_id = new_session(store, "research", "research leases in 3 sources")
    fanned = plain_run(store, session_id, agents=AGENTS)
    first, *rest = fanned.branches
    for seq in rest:
        assert branch(store, session_id, seq).outcome == BranchOutcome.RECORDED
    before_join = store.load_head(session_id)
    assert branch(store, session_id, first).outcome == BranchOutcome.JOINED
    late = branch(FirstLoadFrom(store, before_join), session_id, first)
    assert late.outcome == BranchOutcome.NOT_NEEDED
    # A cancel, by contrast, fences a branch off whose call has no result.
    other = new_session(store, "research", "research queues in 3 sources")
    fanned = plain_run(store, other, agents=AGENTS)
    head = store.load_head(other)
    store.expire_lease(other)
    assert store.claim(other, "someone-else", ttl=30) is not None
    assert branch(FirstLoadFrom(store, head), other, fanned.branches[0]).outcome == (
        BranchOutcome.FENCED
    )
