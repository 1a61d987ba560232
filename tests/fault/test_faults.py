"""Faults injected against real processes: workers SIGKILLed and SIGSTOPped, Redis
restarted, flushed and down, PostgreSQL connections killed, poison sessions, concurrent
operators. Each test checks PostgreSQL afterwards (see conftest.assert_invariants)."""

from __future__ import annotations

import concurrent.futures
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection

from sessions_app.models import AgentSession, ApiToken, SideEffect, Status, Step
from sessions_app.services.core import checkpoint_rollback, session_cancel, session_start

from ..conftest import wait_final, wait_for
from .conftest import (
    assert_completed,
    assert_invariants,
    figures,
    frozen,
    kill_busy_workers_at_random,
    kill_worker_process_only,
    reference,
    runs_of,
    wait_for_tool_results,
)

pytestmark = [pytest.mark.fault, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@contextmanager
def frozen_once(fleet, worker, condition, what: str) -> Iterator[None]:
    """Once `condition()` holds (the worker is in the middle of something), freeze the
    worker and start another: the block runs while it is frozen; it is thawed after."""
    wait_for(condition, timeout=20, interval=0.01, what=what)
    with frozen(worker):
        fleet.start()
        yield


def test_random_sigkills_lose_and_duplicate_nothing(fleet):
    """20 SIGKILLs at random moments (in model calls, between a tool call and its result,
    in the checkpoint transaction, while heartbeating) over 8 sessions."""
    rng = random.Random(20261202)
    ticks = 6
    sessions = [session_start(agent="slow", input=f"count to {ticks}") for _ in range(8)]
    # Kills this dense can hit one session several times in a row before it writes a step,
    # which is what a poison session looks like: detection is tested on its own below.
    no_poison = {"RESPAWN_MAX_CRASHES": "1000"}
    for _ in range(2):
        fleet.start(**no_poison)
    kills = kill_busy_workers_at_random(
        fleet, sessions, rng=rng, kills=20, within=90, pause=(0.3, 1.2), **no_poison
    )
    wait_final(sessions, timeout=90)
    expected = reference("slow", f"count to {ticks}")
    for session in sessions:
        assert_completed(session, expected)
        assert SideEffect.objects.filter(session_id=session.id).count() == ticks
    assert kills >= 10, f"only {kills} kills landed"


def test_sigstop_past_the_lease_then_sigcont_late_writes_are_refused(fleet, settings):
    session = session_start(agent="slow", input="count to 5")
    stopped = fleet.start(RESPAWN_SLOW_DELAY="0.6")

    def called() -> bool:
        return Step.objects.filter(session=session, kind="tool_call").exists()

    with frozen_once(fleet, stopped, called, "the first tool call"):
        wait_for(
            lambda: AgentSession.objects.get(id=session.id).fencing_token >= 2,
            timeout=20,
            what="another worker to take the session over",
        )
    wait_final([session], timeout=40)
    time.sleep(1.5)  # let the thawed worker try its late write
    assert_completed(session, reference("slow", "count to 5"))
    assert "fenced off" in stopped.log() or "lease" in stopped.log()


def test_a_worker_stopped_past_its_lease_counts_no_crash_once_it_comes_back(fleet):
    """Poison detection counts workers that died: the takeover of a stopped worker's
    expired lease counts one (nobody can tell yet), and the stopped worker, once it comes
    back and finds itself fenced off, takes that count back."""
    session = session_start(agent="slow", input="count to 8")
    stopped = fleet.start(RESPAWN_SLOW_DELAY="0.6")
    wait_for(
        lambda: Step.objects.filter(session=session, kind="tool_call").exists(),
        timeout=20,
        interval=0.01,
        what="the first tool call",
    )
    with frozen(stopped):
        fleet.start(RESPAWN_SLOW_DELAY="0.6")
        wait_for(
            lambda: AgentSession.objects.get(id=session.id).fencing_token >= 2,
            timeout=20,
            what="another worker to take the session over",
        )
        assert AgentSession.objects.get(id=session.id).crash_count == 1
    wait_for(
        lambda: "not counted as a crash" in stopped.log(),
        timeout=20,
        what="the stopped worker to come back and find its lease taken",
    )
    assert AgentSession.objects.get(id=session.id).crash_count == 0
    wait_final([session], timeout=60)
    assert_completed(session, reference("slow", "count to 8"))


@pytest.mark.parametrize("fault", ["restart", "flushall"])
def test_redis_restarted_or_flushed_mid_run_every_session_finishes(fleet, private_redis, fault):
    sessions = [session_start(agent="slow", input="count to 4") for _ in range(4)]
    fleet.start()
    wait_for_tool_results(sessions, 2)
    if fault == "restart":
        private_redis.restart()
        for worker in fleet.alive():
            worker.kill()  # RQ workers give up when their Redis goes; a supervisor restarts them
        fleet.start()
    else:
        private_redis.flushall()
    wait_final(sessions, timeout=60)
    for session in sessions:
        assert_completed(session, reference("slow", "count to 4"))


def test_postgres_connections_killed_mid_run(fleet):
    sessions = [session_start(agent="slow", input="count to 5") for _ in range(3)]
    fleet.start()
    wait_for_tool_results(sessions, 2)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        killed = len(cursor.fetchall())
    assert killed >= 1
    wait_final(sessions, timeout=60)
    for session in sessions:
        assert_completed(session, reference("slow", "count to 5"))


def test_twenty_concurrent_resumes_start_exactly_one_run(live_server, fleet, users):
    session = session_start(agent="demo", input="what is (12*7)+3, then save it as a note")
    fleet.start()
    wait_final([session])
    checkpoint_rollback(session_id=session.id, checkpoint_seq=7)
    _, token = ApiToken.issue(users["operator"])
    import urllib.error
    import urllib.request

    def resume(_):
        request = urllib.request.Request(
            f"{live_server.url}/api/sessions/{session.id}/resume",
            method="POST",
            data=b"",
            # urllib labels any body a form; the API takes JSON bodies only (415 otherwise).
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=20) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    runs_before = runs_of(session)
    with concurrent.futures.ThreadPoolExecutor(max_workers=20) as pool:
        answers = list(pool.map(resume, range(20)))
    codes = sorted(code for code, _ in answers)
    assert codes.count(202) == 1, answers
    assert all(code == 409 for code in codes if code != 202)
    # Refused because the one run is queued or going, or (a worker finishes this run in
    # well under 100 ms) because it has already completed it: never for another reason.
    assert all(
        "already" in body or "completed session cannot be resumed" in body
        for code, body in answers
        if code == 409
    ), answers
    wait_final([session])
    session.refresh_from_db()
    assert session.status == Status.COMPLETED
    assert runs_of(session) == runs_before + 1
    assert_invariants(session)


def test_hanging_model_call_times_out_and_the_lease_is_not_stolen(fleet, openai_server):
    from tests.stubs.llm_servers import Reply, openai_reply

    openai_server.script(Reply(delay=4.0, body={}), openai_reply("Hello after the hang."))
    env = dict(
        RESPAWN_MODEL="openai:stub-model",
        OPENAI_BASE_URL=openai_server.url + "/v1",
        OPENAI_API_KEY="sk-test-hang-0123456789",
        RESPAWN_MODEL_TIMEOUT="3",
    )
    session = session_start(agent="echo", input="hello")
    fleet.start(**env)
    fleet.start(**env)  # a second worker that would take a lease left to expire
    wait_final([session], timeout=40)
    session.refresh_from_db()
    assert session.status == Status.COMPLETED and session.final_answer == "Hello after the hang."
    assert session.fencing_token == 1, "the lease was never taken over"
    assert runs_of(session) == 1
    assert len(openai_server.requests) == 2
    assert_invariants(session)


def test_poison_session_fails_after_repeated_crashes_and_blocks_no_one(fleet):
    poison = session_start(agent="poison", input="go")
    healthy = session_start(agent="slow", input="count to 3")
    for _ in range(2):
        fleet.start()
    wait_final([healthy], timeout=60)
    wait_final([poison], timeout=90)
    poison.refresh_from_db()
    healthy.refresh_from_db()
    assert healthy.status == Status.COMPLETED
    assert poison.status == Status.FAILED
    assert "died 5 times in a row" in poison.last_error
    assert_invariants(poison)


def test_only_the_worker_process_killed_comes_back_through_the_lease(fleet):
    """The OOM killer takes the process running the jobs, not its supervisor: the
    supervisor starts a new one, which takes the session over when its lease runs out."""
    session = session_start(agent="slow", input="count to 5")
    worker = fleet.start()
    wait_for_tool_results([session], 1, interval=0.02, what="the run to get going")
    first = worker.pids()[1:]
    assert kill_worker_process_only(worker)
    wait_final([session], timeout=40)
    session.refresh_from_db()
    assert session.status == Status.COMPLETED
    assert worker.process.poll() is None, "the supervisor survived its worker process"
    assert worker.pids()[1:] and set(worker.pids()[1:]).isdisjoint(first), "a new process"
    assert "died (killed by SIGKILL); starting a new one" in worker.log()
    assert runs_of(session) >= 2
    assert_completed(session, reference("slow", "count to 5"))


def test_crash_between_commit_and_enqueue_is_dispatched_by_the_reconciler(fleet, monkeypatch):
    from sessions_app.services import dispatch

    monkeypatch.setattr(
        dispatch, "enqueue", lambda session_id, job_id: False
    )  # on_commit never ran
    session = session_start(agent="echo", input="hi")
    monkeypatch.undo()
    fleet.start()
    wait_final([session], timeout=30)
    assert_completed(session)


def test_redis_down_reads_answer_and_actions_are_dispatched_once_it_is_back(
    client, users, fleet, private_redis
):
    session = session_start(agent="demo", input="what is 2+2")
    fleet.start()
    wait_final([session])
    session.refresh_from_db()
    checkpoint_rollback(session_id=session.id, checkpoint_seq=session.head)
    private_redis.stop()
    client.force_login(users["operator"])
    _, token = ApiToken.issue(users["operator"])
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    for url in ["/sessions/", f"/sessions/{session.id}/", "/sessions/attention/", "/audit/"]:
        assert client.get(url).status_code == 200, url
    assert client.get(f"/api/sessions/{session.id}", **auth).status_code == 200
    assert client.get(f"/api/sessions/{session.id}/steps", **auth).status_code == 200
    response = client.post(
        f"/api/sessions/{session.id}/resume", content_type="application/json", **auth
    )
    assert response.status_code == 202  # recorded in PostgreSQL, dispatched later
    assert AgentSession.objects.get(id=session.id).status == Status.QUEUED
    private_redis.start()
    for worker in fleet.alive():
        worker.kill()
    fleet.start()
    wait_final([session], timeout=40)
    assert_completed(session)


@pytest.mark.parametrize("action", ["rollback", "cancel"])
def test_rollback_or_cancel_while_a_step_is_in_flight_fences_the_old_run(fleet, action):
    session = session_start(agent="slow", input="count to 6")
    worker = fleet.start(RESPAWN_SLOW_DELAY="0.8")
    wait_for_tool_results([session], 2, timeout=30, interval=0.02, what="two ticks")
    wait_for(
        lambda: Step.objects.filter(session=session).order_by("-seq").first().kind == "tool_call",
        timeout=10,
        interval=0.01,
        what="a tick in flight",
    )
    if action == "rollback":
        with frozen(worker):  # a GC pause long enough to lose the lease
            wait_for(
                lambda: not AgentSession.objects.get(id=session.id).lease_is_live(),
                timeout=10,
                what="the lease to expire",
            )
            first = Step.objects.filter(session=session, kind="tool_result").order_by("seq").first()
            checkpoint_rollback(session_id=session.id, checkpoint_seq=first.seq)
    else:
        session_cancel(session_id=session.id)  # the lease is live: fenced at once
    marker = Step.objects.filter(session=session, kind="operator").order_by("-seq").first()
    time.sleep(2.5)  # the in-flight tick finishes and tries to write
    session.refresh_from_db()
    assert session.status == (Status.PAUSED if action == "rollback" else Status.CANCELLED)
    assert not Step.objects.filter(session=session, seq__gt=marker.seq).exists(), (
        "a late write landed"
    )
    assert_invariants(session)


def test_a_frozen_worker_continued_after_a_person_reran_its_call_sends_nothing(fleet):
    """SIGSTOP a worker while it sends a notification (a tool that is not idempotent); its
    lease runs out; another worker finds the call uncertain; a person says "run it again";
    the session completes. Then SIGCONT: the frozen worker's send is refused by the fence
    and reported, so there is one notification, and it is the one in the trace."""
    from sessions_app.models import AuditEvent
    from sessions_app.services.core import session_resolve_uncertain

    session = session_start(agent="notify", input="deploy finished")
    stopped = fleet.start(RESPAWN_SLOW_DELAY="1.5")

    def sending() -> bool:
        return AgentSession.objects.get(id=session.id).progress_note.startswith("sending")

    with frozen_once(fleet, stopped, sending, "the notification to be on its way"):
        wait_for(
            lambda: Step.objects.filter(
                session=session, kind="system", payload__event="uncertain_call"
            ).exists(),
            timeout=30,
            what="another worker to find the call uncertain",
        )
        wait_final([session], timeout=20)
        session_resolve_uncertain(session_id=session.id, resolution="rerun", note="not sent")
        wait_for(
            lambda: AgentSession.objects.get(id=session.id).status == Status.COMPLETED,
            timeout=30,
            what="the rerun to complete the session",
        )
    late = wait_for(
        lambda: AuditEvent.objects.filter(session=session, action="late_tool_call").first(),
        timeout=15,
        what="the frozen worker to report its late call",
    )
    time.sleep(0.5)
    session.refresh_from_db()
    assert session.status == Status.COMPLETED and session.failed_calls == 0
    effects = SideEffect.objects.filter(session_id=session.id, tool="send_notification")
    assert effects.count() == 1 and effects.get().attempts == 1, "two notifications"
    results = Step.objects.filter(session=session, kind="tool_result")
    assert [r.payload["status"] for r in results] == ["ok"]
    assert late.after["effect"] == "refused" and late.after["tool"] == "send_notification"
    assert late.after["idempotency_key"] == effects.get().key
    assert "was refused by the fence" in stopped.log()
    assert_invariants(session)
    figures("frozen worker continued", notifications=effects.count(), late_calls_reported=1)


def test_jobs_lost_before_a_worker_took_them_run_within_the_reconcile_interval(
    fleet, private_redis
):
    """Redis loses the jobs of queued sessions (FLUSHALL while the only worker is
    stopped): they run within a reconciler pass or two of the worker going on, not after
    the dispatch grace (30 s here)."""
    worker = fleet.start(RESPAWN_DISPATCH_GRACE="30", RESPAWN_RECONCILE_INTERVAL="0.5")
    warm = session_start(agent="echo", input="warm up")
    wait_final([warm], timeout=30)
    with frozen(worker):
        sessions = [session_start(agent="echo", input=f"hello {n}") for n in range(4)]
        time.sleep(1.2)  # older than the moment a dispatch takes to reach Redis
        private_redis.flushall()
    going_on = time.monotonic()
    wait_final(sessions, timeout=30)
    took = time.monotonic() - going_on
    for session in sessions:
        session.refresh_from_db()
        assert session.status == Status.COMPLETED, (session.id, session.status)
        assert runs_of(session) == 1
        assert_invariants(session)
    # A pass every 0.5 s (±20 %), plus the run itself, on a busy machine: far from 30 s.
    assert took < 8, took
    figures("jobs lost before a worker took them", sessions=len(sessions), all_done_s=took)
