"""Dashboard latency at scale: 1,000,000 sessions and one session of 100,000 steps.

    python -m bench.dashboard [--sessions 1000000] [--steps 100000] [--rounds 30] [--reuse]
                              [--database respawn_bench_dashboard]

Seeds a database of its own with COPY, then renders each page with Django's test client
(in process: server time, no network) and prints the median and p95 of each, with its
query count. The long session has what an operator looks for in one: several runs (one
after a worker crashed mid-call), retried tool calls and failed steps. Pages marked
"cold" are timed with the cache emptied first (their counts and charts are cached for
seconds). Not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta

import psycopg

from ._db import database_url, fresh_database, migrate_database, setup_django
from ._workload import AGENTS, STATUSES

DB_NAME = "respawn_bench_dashboard"
SESSION_COLUMNS = (
    "id, agent, title, status, head, last_seq, fencing_token, cancel_requested, job_id, "
    "last_error, step_count, tokens_in, tokens_out, cost, final_answer, created_at, updated_at"
)


def seed(url: str, sessions: int, steps: int) -> uuid.UUID:
    rng = random.Random(7)
    now = datetime.now(UTC)
    big = uuid.UUID(int=rng.getrandbits(128))
    started = time.perf_counter()
    with psycopg.connect(url) as conn:
        with conn.cursor() as cur:
            with cur.copy(f"COPY sessions_app_agentsession ({SESSION_COLUMNS}) FROM STDIN") as copy:
                for i in range(sessions):
                    sid = big if i == 0 else uuid.UUID(int=rng.getrandbits(128))
                    created = now - timedelta(seconds=rng.randint(0, 90 * 86400))
                    updated = created + timedelta(seconds=rng.randint(1, 3600))
                    status = "running" if i == 0 else rng.choice(STATUSES)
                    n = steps if i == 0 else rng.randint(3, 40)
                    copy.write_row(
                        (
                            sid,
                            rng.choice(AGENTS),
                            f"bench session {i}",
                            status,
                            n,
                            n,
                            1,
                            False,
                            "",
                            "",
                            n,
                            n * 40,
                            n * 10,
                            0,
                            "",
                            created,
                            updated,
                        )
                    )
            print(
                f"  {sessions:,} sessions copied in {time.perf_counter() - started:.1f}s",
                flush=True,
            )
            started = time.perf_counter()
            t0 = now - timedelta(hours=3)
            # Where the trouble is: a run that died after a tool call (the next run starts
            # in its place), and failed and retried tool results along the way.
            crash_at = (steps // 3) // 3 * 3 + 2  # a tool_call
            failed = {seq for seq in range(steps // 4 // 3 * 3, steps, steps // 5 // 3 * 3 or 3)}
            with cur.copy(
                "COPY sessions_app_step (session_id, seq, kind, payload, schema_version, started_at, "
                "finished_at, tokens_in, tokens_out, idempotency_key, created_at) FROM STDIN"
            ) as copy:
                for seq in range(1, steps + 1):
                    phase = seq % 3
                    at = t0 + timedelta(milliseconds=seq * 50)
                    if seq > crash_at:
                        at += timedelta(seconds=40)  # the lease expired, another worker took over
                    if seq in (2, crash_at + 1):
                        kind, payload = (
                            "system",
                            {"event": "run_started", "worker": f"bench-w{1 if seq == 2 else 2}"},
                        )
                    elif phase == 1:
                        kind, payload = (
                            "model",
                            {
                                "text": f"Tick {seq}.",
                                "tool_calls": [
                                    {"id": f"call_{seq}", "name": "tick", "arguments": {"n": seq}}
                                ],
                                "usage": {"input_tokens": 40, "output_tokens": 10},
                                "model": "scripted:slow",
                            },
                        )
                    elif phase == 2:
                        kind, payload = (
                            "tool_call",
                            {"call_id": f"call_{seq - 1}", "name": "tick", "arguments": {"n": seq}},
                        )
                    else:
                        kind, payload = (
                            "tool_result",
                            {
                                "call_id": f"call_{seq - 2}",
                                "name": "tick",
                                "ok": seq not in failed,
                                "output": {"n": seq} if seq not in failed else None,
                                "error": "tick refused" if seq in failed else None,
                                "attempts": 3 if seq % 291 == 0 else 1,
                            },
                        )
                    if seq == 1:
                        kind, payload = "user", {"text": f"count to {steps}"}
                    copy.write_row(
                        (
                            big,
                            seq,
                            kind,
                            json.dumps(payload),
                            1,
                            at,
                            at + timedelta(milliseconds=20),
                            40 if kind == "model" else 0,
                            10 if kind == "model" else 0,
                            f"{big}:{seq}" if kind == "tool_call" else None,
                            at,
                        )
                    )
            cur.execute(
                "INSERT INTO sessions_app_checkpoint (session_id, seq, state, schema_version, reason, created_at) "
                "VALUES (%s, %s, %s, 1, 'auto', now())",
                (
                    big,
                    steps,
                    json.dumps(
                        {
                            "schema_version": 1,
                            "agent": {"name": "slow", "version": "1"},
                            "turn": steps // 3,
                            "plan": [],
                            "memory_refs": [],
                            "counters": {
                                "steps": steps,
                                "model_calls": 0,
                                "tool_calls": 0,
                                "tokens_in": 0,
                                "tokens_out": 0,
                                "cost": 0.0,
                                "retries": 0,
                            },
                            "budgets": {"max_steps": 200000, "max_tokens": None, "max_cost": None},
                            "pending_approval": None,
                            "uncertain_calls": [],
                            "batch_cursor": None,
                            "final_answer": None,
                        }
                    ),
                ),
            )
            cur.execute(
                "UPDATE sessions_app_agentsession SET lease_owner = 'bench', lease_expires_at = now() + interval '1 day' WHERE id = %s",
                (big,),
            )
        conn.commit()
        print(f"  {steps:,} steps copied in {time.perf_counter() - started:.1f}s", flush=True)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    return big


def measure(client, url: str, rounds: int, *, htmx: bool | str = False, cold: bool = False):
    from django.core.cache import cache
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    headers = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    if isinstance(htmx, str):
        headers["HTTP_HX_TARGET"] = htmx  # the part of the page the request redraws
    client.get(url, **headers)  # warm caches and connections
    times = []
    queries = 0
    for _ in range(rounds):
        if cold:
            cache.clear()
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            response = client.get(url, **headers)
            times.append((time.perf_counter() - started) * 1000)
        queries = len(captured)
        assert response.status_code in (200, 286), (url, response.status_code)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.95) - 1], queries


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument(
        "--reuse", action="store_true", help="keep the seeded database from a previous run"
    )
    parser.add_argument("--database", default=DB_NAME, help="the database to seed and use")
    args = parser.parse_args()

    url = database_url(args.database)
    if args.reuse:
        migrate_database(url)
        big = None
    else:
        print(
            f"seeding {args.database}: {args.sessions:,} sessions, one of {args.steps:,} steps",
            flush=True,
        )
        url = fresh_database(args.database)
        big = seed(url, args.sessions, args.steps)
    setup_django(url)

    from django.contrib.auth.models import User
    from django.test import Client

    from sessions_app.models import AgentSession, Step
    from sessions_app.selectors.core import SessionFilters, session_page

    if big is None:
        big = AgentSession.objects.order_by("-step_count").values_list("id", flat=True).first()
    user, _ = User.objects.get_or_create(
        username="bench", defaults={"is_superuser": True, "is_staff": True}
    )
    client = Client()
    client.force_login(user)
    first = session_page(SessionFilters(), None, 50)
    second = session_page(SessionFilters(), first.next_cursor, 50, position=51)
    failed_first = session_page(SessionFilters(status="failed"), None, 50)
    some = AgentSession.objects.filter(status="completed").values_list("id", flat=True).first()
    last = AgentSession.objects.get(id=big).last_seq
    args.steps = Step.objects.filter(session_id=big).count()  # as seeded (--reuse: earlier)
    crash = (
        Step.objects.filter(session_id=big, kind="system", payload__event="run_started")
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    )
    pages = [
        # name, path, htmx fragment (or the part it targets), timed with an empty cache
        ("list: first page", "/sessions/", False, False),
        ("list: first page (counts not cached)", "/sessions/", False, True),
        ("list: next page (keyset)", f"/sessions/?cursor={first.next_cursor}&pos=51", False, False),
        (
            "list: previous page (keyset)",
            f"/sessions/?before={second.prev_cursor}&pos=1",
            False,
            False,
        ),
        ("list: status=failed", "/sessions/?status=failed", False, False),
        (
            "list: status=failed, next page",
            f"/sessions/?status=failed&cursor={failed_first.next_cursor}&pos=51",
            False,
            False,
        ),
        ("list: agent=flaky, oldest first", "/sessions/?agent=flaky&sort=created", False, False),
        ("list: agent=flaky (counts not cached)", "/sessions/?agent=flaky", False, True),
        ("list: search 'bench session 7'", "/sessions/?q=bench+session+7", False, True),
        ("list: live row fragment", f"/sessions/{big}/row/", True, False),
        ("list: status counts fragment", "/sessions/counts/", True, False),
        ("list: status counts fragment (not cached)", "/sessions/counts/", True, True),
        ("list: charts, 24 h (not cached)", "/sessions/charts/?span=24h", True, True),
        ("list: charts, 30 d (not cached)", "/sessions/charts/?span=30d", True, True),
        (f"detail: first screen ({args.steps:,} steps)", f"/sessions/{big}/", False, False),
        ("detail: latest steps", f"/sessions/{big}/?from={last - 49}", False, False),
        ("detail: from the crashed run", f"/sessions/{big}/?from={crash - 3}", False, False),
        ("detail: failed steps only", f"/sessions/{big}/?status=failed", False, False),
        ("detail: trace part (filter, jump)", f"/sessions/{big}/?from={last // 2}", "trace", False),
        ("detail: live tail fragment", f"/sessions/{big}/steps/?after={last}", True, False),
        (
            "detail: next trace page",
            f"/sessions/{big}/steps/?after={last // 2}&turns=1&runs=1",
            True,
            False,
        ),
        ("detail: header fragment", f"/sessions/{big}/panel/?part=header", True, False),
        (f"detail: timeline ({args.steps:,} steps)", f"/sessions/{big}/timeline/", True, False),
        (
            "detail: timeline zoomed to 150 steps",
            f"/sessions/{big}/timeline/?from={last // 2}&to={last // 2 + 149}",
            True,
            False,
        ),
        ("detail: tokens and cost per turn", f"/sessions/{big}/usage/", True, False),
        ("detail: small session", f"/sessions/{some}/", False, False),
        ("needs attention", "/sessions/attention/", False, False),
        ("needs attention: one section's page", "/sessions/attention/?section=failed", True, False),
    ]
    print(f"\n{'page':46} {'median ms':>10} {'p95 ms':>8} {'queries':>8}")
    for name, path, htmx, cold in pages:
        median, p95, queries = measure(client, path, args.rounds, htmx=htmx, cold=cold)
        print(f"{name:46} {median:10.2f} {p95:8.2f} {queries:8d}", flush=True)


if __name__ == "__main__":
    main()
