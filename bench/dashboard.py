"""Dashboard latency at scale: 1,000,000 sessions and one session of 100,000 steps.

    python -m bench.dashboard [--sessions 1000000] [--steps 100000] [--rounds 30] [--reuse]

Seeds a database of its own (respawn_bench_dashboard) with COPY, then renders each page
with Django's test client (in process: server time, no network) and prints the median and
p95 of each, with its query count. Not a test: it prints figures.
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

from ._db import fresh_database, server_url, setup_django, with_db

DB_NAME = "respawn_bench_dashboard"
STATUSES = (
    ["completed"] * 80
    + ["failed"] * 8
    + ["cancelled"] * 4
    + ["paused"] * 3
    + ["waiting_input"] * 3
    + ["running", "queued"]
)
AGENTS = ["demo", "slow", "flaky", "approval", "echo"]
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
            with cur.copy(
                "COPY sessions_app_step (session_id, seq, kind, payload, schema_version, started_at, "
                "finished_at, tokens_in, tokens_out, idempotency_key, created_at) FROM STDIN"
            ) as copy:
                for seq in range(1, steps + 1):
                    phase = seq % 3
                    at = t0 + timedelta(milliseconds=seq * 50)
                    if phase == 1:
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
                                "ok": True,
                                "output": {"n": seq},
                                "error": None,
                                "attempts": 1,
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


def measure(client, url: str, rounds: int):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client.get(url)  # warm caches and connections
    times = []
    queries = 0
    for _ in range(rounds):
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            response = client.get(url)
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
    args = parser.parse_args()

    url = with_db(server_url(), DB_NAME)
    if args.reuse:
        import os
        import subprocess
        import sys

        from ._db import ROOT

        env = {
            **os.environ,
            "DATABASE_URL": url,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "RESPAWN_PRODUCTION": "0",
        }
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True
        )
        big = None
    else:
        print(
            f"seeding {DB_NAME}: {args.sessions:,} sessions, one of {args.steps:,} steps",
            flush=True,
        )
        url = fresh_database(DB_NAME)
        big = seed(url, args.sessions, args.steps)
    setup_django(url)

    from django.contrib.auth.models import User
    from django.test import Client

    from sessions_app.models import AgentSession
    from sessions_app.selectors import SessionFilters, session_page

    if big is None:
        big = AgentSession.objects.order_by("-step_count").values_list("id", flat=True).first()
    user, _ = User.objects.get_or_create(
        username="bench", defaults={"is_superuser": True, "is_staff": True}
    )
    client = Client()
    client.force_login(user)
    _, cursor = session_page(SessionFilters(), None, 50)
    _, failed_cursor = session_page(SessionFilters(status="failed"), None, 50)
    some = AgentSession.objects.filter(status="completed").values_list("id", flat=True).first()
    last = AgentSession.objects.get(id=big).last_seq
    pages = [
        ("list: first page", "/sessions/"),
        ("list: next page (keyset)", f"/sessions/?cursor={cursor}"),
        ("list: status=failed", "/sessions/?status=failed"),
        ("list: status=failed, next page", f"/sessions/?status=failed&cursor={failed_cursor}"),
        ("list: agent=flaky, oldest first", "/sessions/?agent=flaky&sort=created"),
        ("list: live row fragment", f"/sessions/{big}/row/"),
        ("list: status counts fragment", "/sessions/counts/"),
        (f"detail: first screen ({args.steps:,} steps)", f"/sessions/{big}/"),
        ("detail: latest steps", f"/sessions/{big}/?from={last - 49}"),
        ("detail: live tail fragment", f"/sessions/{big}/steps/?after={last}"),
        ("detail: next trace page", f"/sessions/{big}/steps/?after=50000"),
        ("detail: header fragment", f"/sessions/{big}/panel/?part=header"),
        ("detail: small session", f"/sessions/{some}/"),
        ("needs attention", "/sessions/attention/"),
    ]
    print(f"\n{'page':44} {'median ms':>10} {'p95 ms':>8} {'queries':>8}")
    for name, path in pages:
        median, p95, queries = measure(client, path, args.rounds)
        print(f"{name:44} {median:10.2f} {p95:8.2f} {queries:8d}", flush=True)


if __name__ == "__main__":
    main()
