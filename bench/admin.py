"""Django admin latency at scale: 1,000,000 sessions and 10,000,000 steps.

    python -m bench.admin [--sessions 1000000] [--steps 10000000] [--rounds 20] [--reuse]

Seeds a database of its own (respawn_bench_admin): sessions, their steps (one session of
100,000, or of a tenth of --steps when that is fewer), checkpoints about every fourth step and an audit trail, loaded with COPY into
tables whose indexes and constraints are dropped first and rebuilt afterwards (the
rebuild times are printed: they are also what migration 0011's indexes cost to build).
Then renders each admin page with Django's test client (in process: server time, no
network) and prints the median and p95 of each with its query count, checking that no
query counted a whole table. Last, for comparison, what Django's defaults would have run:
a full COUNT(*) per list and the date hierarchy's SELECT DISTINCT. Not a test: it prints
figures. The full sizes take a while to seed (progress is printed); --reuse skips that.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta

import psycopg

from ._db import database_url, fresh_database, migrate_database, setup_django
from ._workload import AGENTS, STATUSES

DB_NAME = "respawn_bench_admin"
TABLES = [
    "sessions_app_agentsession",
    "sessions_app_step",
    "sessions_app_checkpoint",
    "sessions_app_auditevent",
]
VERBS = ["Summarise", "Refund", "Check", "Translate", "Reconcile", "Draft", "Review", "Plan"]
NOUNS = [
    "invoice",
    "contract",
    "ticket",
    "order",
    "report",
    "shipment",
    "payroll",
    "forecast",
    "incident",
    "migration",
]
BIG_STEPS = 100_000
PROGRESS_EVERY = 1_000_000
SESSION_COLUMNS = (
    "id, agent, title, status, head, last_seq, lease_owner, lease_expires_at, fencing_token, "
    "cancel_requested, job_id, dispatched_at, last_error, step_count, tokens_in, tokens_out, "
    "cost, final_answer, created_at, updated_at"
)
STEP_COLUMNS = (
    "session_id, seq, kind, payload, schema_version, started_at, finished_at, tokens_in, "
    "tokens_out, idempotency_key, superseded_at, created_at"
)
CHECKPOINT_COLUMNS = "session_id, seq, state, schema_version, reason, created_at"
AUDIT_COLUMNS = "actor_label, action, session_id, before, after, request_meta, created_at"


# --- Seeding ---------------------------------------------------------------------------------


def drop_indexes(conn) -> list[tuple[str, str]]:
    """Drop every index and constraint of the bench tables (and foreign keys into them);
    returns the statements that rebuild them, in a valid order."""
    keys = conn.execute(
        "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid), contype "
        "FROM pg_constraint WHERE contype IN ('p', 'u', 'f') "
        "AND (conrelid = ANY(%s::regclass[]) OR confrelid = ANY(%s::regclass[]))",
        (TABLES, TABLES),
    ).fetchall()
    names = {name for _, name, _, _ in keys}
    indexes = [
        (name, definition)
        for name, definition in conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = ANY(%s)", (TABLES,)
        ).fetchall()
        if name not in names
    ]
    foreign = [k for k in keys if k[3] == "f"]
    unique = [k for k in keys if k[3] != "f"]
    for table, name, _, _ in foreign + unique:
        conn.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
    for name, _ in indexes:
        conn.execute(f'DROP INDEX "{name}"')
    rebuild = [
        (f"{table} {name}", f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}')
        for table, name, definition, _ in unique
    ]
    rebuild += [(name, definition) for name, definition in indexes]
    rebuild += [
        (f"{table} {name}", f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}')
        for table, name, definition, _ in foreign
    ]
    return rebuild


def state_json(turn: int, steps: int, final: str | None, version: int) -> str:
    return json.dumps(
        {
            "schema_version": version,
            "agent": {"name": "demo", "version": "1"},
            "turn": turn,
            "plan": [
                {"title": "look it up", "status": "done"},
                {"title": "answer", "status": "pending"},
            ],
            "memory_refs": [],
            "counters": {
                "steps": steps,
                "model_calls": turn,
                "tool_calls": turn,
                "tokens_in": turn * 40,
                "tokens_out": turn * 10,
                "cost": 0.0,
                "retries": 0,
            },
            "budgets": {"max_steps": 200, "max_tokens": None, "max_cost": None},
            "pending_approval": None,
            "uncertain_calls": [],
            "batch_cursor": None,
            "final_answer": final,
        }
    )


def step_row(rng: random.Random, sid: uuid.UUID, seq: int, n: int, at: datetime, newer: int):
    """One step of a trace: user, system, then model / tool_call / tool_result turns."""
    tokens = (0, 0)
    key = None
    if seq == 1:
        kind, payload = "user", {"text": f"please handle item {seq}"}
    elif seq == 2:
        kind, payload = "system", {"event": "run_started", "checkpoint_seq": None, "upgraders": []}
    elif seq == n:
        kind, payload = "model", {"text": "Done.", "tool_calls": [], "usage": {"cost": 0.0}}
        tokens = (40, 10)
    else:
        phase = (seq - 3) % 3
        call = f"call_{seq - phase}"
        if phase == 0:
            kind, payload = (
                "model",
                {
                    "text": f"Looking up {seq}.",
                    "tool_calls": [{"id": call, "name": "lookup", "arguments": {"n": seq}}],
                    "usage": {"cost": 0.0},
                },
            )
            tokens = (40, 10)
        elif phase == 1:
            kind, payload = (
                "tool_call",
                {"call_id": call, "name": "lookup", "arguments": {"n": seq}},
            )
            key = f"{sid}:{seq}"
        else:
            roll = rng.random()
            if roll < 0.003:
                kind, payload = "error", {"where": "tool", "error": "timeout", "attempts": 3}
            elif roll < 0.004:
                kind, payload = "operator", {"action": "correct_result", "actor": "olivia"}
            else:
                kind, payload = (
                    "tool_result",
                    {
                        "call_id": call,
                        "name": "lookup",
                        "ok": True,
                        "output": {"n": seq, "found": f"record {seq}"},
                        "error": None,
                        "attempts": 1,
                    },
                )
    version = newer if rng.random() < 0.0001 else 1
    return (
        sid,
        seq,
        kind,
        json.dumps(payload),
        version,
        at,
        at + timedelta(milliseconds=20),
        tokens[0],
        tokens[1],
        key,
        None,
        at,
    )


def seed(url: str, sessions: int, steps: int, newer: int) -> None:
    rng = random.Random(11)
    now = datetime.now(UTC)
    big_steps = min(BIG_STEPS, max(steps // 10, 3))
    # Trace lengths spread over [mean/2, 3*mean/2] so the total comes near `steps`.
    mean = max(3.0, (steps - big_steps) / max(sessions - 1, 1))
    started = time.perf_counter()
    with psycopg.connect(url) as admin_conn:
        rebuild = drop_indexes(admin_conn)
        admin_conn.commit()
    conns = [psycopg.connect(url) for _ in range(4)]
    counts = {"sessions": 0, "steps": 0, "checkpoints": 0, "audit": 0}
    next_report = PROGRESS_EVERY
    try:
        c_s, c_st, c_cp, c_a = (conn.cursor() for conn in conns)
        with (
            c_s.copy(f"COPY sessions_app_agentsession ({SESSION_COLUMNS}) FROM STDIN") as s_copy,
            c_st.copy(f"COPY sessions_app_step ({STEP_COLUMNS}) FROM STDIN") as st_copy,
            c_cp.copy(f"COPY sessions_app_checkpoint ({CHECKPOINT_COLUMNS}) FROM STDIN") as cp_copy,
            c_a.copy(f"COPY sessions_app_auditevent ({AUDIT_COLUMNS}) FROM STDIN") as a_copy,
        ):
            for i in range(sessions):
                sid = uuid.UUID(int=rng.getrandbits(128))
                created = now - timedelta(seconds=rng.randint(0, 400 * 86400))
                n = big_steps if i == 0 else max(3, round(rng.uniform(mean / 2, mean * 1.5)))
                status = "paused" if i == 0 else rng.choice(STATUSES)
                lease_owner = lease_until = None
                if status == "running" and rng.random() < 0.5:
                    lease_owner, lease_until = "bench-worker", now + timedelta(days=1)
                dispatched = created if status in ("queued", "running") else None
                checkpoint_seqs = list(range(4, n, 4)) + ([n] if status == "completed" else [])
                head = checkpoint_seqs[-1] if checkpoint_seqs else 0
                at = created
                for seq in range(1, n + 1):
                    at = created + timedelta(milliseconds=seq * 50)
                    st_copy.write_row(step_row(rng, sid, seq, n, at, newer))
                updated = at
                for seq in checkpoint_seqs:
                    roll = rng.random()
                    reason = (
                        "manual"
                        if roll < 0.01
                        else "before-rollback"
                        if roll < 0.015
                        else "migration"
                        if roll < 0.016
                        else "auto"
                    )
                    version = newer if rng.random() < 0.0001 else 1
                    final = "Done." if seq == n else None
                    cp_copy.write_row(
                        (
                            sid,
                            seq,
                            state_json(seq // 3, seq, final, version),
                            version,
                            reason,
                            created + timedelta(milliseconds=seq * 50 + 25),
                        )
                    )
                s_copy.write_row(
                    (
                        sid,
                        rng.choice(AGENTS),
                        f"{rng.choice(VERBS)} the {rng.choice(NOUNS)} {i}",
                        status,
                        head,
                        n,
                        lease_owner,
                        lease_until,
                        1,
                        False,
                        "",
                        dispatched,
                        "boom" if status == "failed" else "",
                        n,
                        n * 13,
                        n * 3,
                        0,
                        "Done." if status == "completed" else "",
                        created,
                        updated,
                    )
                )
                actions = ["start"]
                if status == "cancelled":
                    actions.append("cancel")
                if rng.random() < 0.02:
                    actions.append("resume")
                if rng.random() < 0.005:
                    actions.append("rollback")
                for offset, action in enumerate(actions):
                    a_copy.write_row(
                        (
                            "bench",
                            action,
                            sid,
                            "{}",
                            json.dumps({"status": status, "head": head}),
                            '{"via": "bench"}',
                            created + timedelta(seconds=offset),
                        )
                    )
                counts["sessions"] += 1
                counts["steps"] += n
                counts["checkpoints"] += len(checkpoint_seqs)
                counts["audit"] += len(actions)
                if counts["steps"] >= next_report:
                    next_report += PROGRESS_EVERY
                    print(
                        f"  {counts['steps']:>12,} steps, {counts['sessions']:,} sessions, "
                        f"{time.perf_counter() - started:.0f}s",
                        flush=True,
                    )
        for conn in conns:
            conn.commit()
    finally:
        for conn in conns:
            conn.close()
    print(
        f"  copied {counts['sessions']:,} sessions, {counts['steps']:,} steps, "
        f"{counts['checkpoints']:,} checkpoints, {counts['audit']:,} audit events "
        f"in {time.perf_counter() - started:.0f}s",
        flush=True,
    )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET maintenance_work_mem = '1GB'")
        conn.execute("SET max_parallel_maintenance_workers = 2")
        for name, sql in rebuild:
            at = time.perf_counter()
            conn.execute(sql)
            print(f"  rebuilt {name} in {time.perf_counter() - at:.1f}s", flush=True)
        at = time.perf_counter()
        conn.execute("VACUUM ANALYZE")
        print(f"  VACUUM ANALYZE in {time.perf_counter() - at:.0f}s", flush=True)
        for table in TABLES:
            size = conn.execute(
                "SELECT pg_size_pretty(pg_table_size(%s)), pg_size_pretty(pg_indexes_size(%s))",
                (table, table),
            ).fetchone()
            print(f"  {table}: table {size[0]}, indexes {size[1]}", flush=True)


# --- Timing ----------------------------------------------------------------------------------


def unbounded_counts(queries) -> list[str]:
    return [q["sql"] for q in queries if "COUNT(" in q["sql"].upper() and "LIMIT" not in q["sql"]]


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
        assert response.status_code == 200, (url, response.status_code)
        assert not unbounded_counts(captured.captured_queries), url
    times.sort()
    return statistics.median(times), times[max(0, int(len(times) * 0.95) - 1)], queries


def raw_ms(sql: str, rounds: int = 3) -> float:
    from django.db import connection

    times = []
    with connection.cursor() as cursor:
        for _ in range(rounds):
            started = time.perf_counter()
            cursor.execute(sql)
            cursor.fetchall()
            times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=10_000_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--reuse", action="store_true", help="keep the seeded database from a previous run"
    )
    args = parser.parse_args()
    os.environ.setdefault("RESPAWN_PRODUCTION", "0")  # a benchmark: no SECRET_KEY needed

    url = database_url(DB_NAME)
    if args.reuse:
        migrate_database(url)
    else:
        print(f"seeding {DB_NAME}: {args.sessions:,} sessions, {args.steps:,} steps", flush=True)
        url = fresh_database(DB_NAME)
        from agent_runtime.state import SCHEMA_VERSION

        seed(url, args.sessions, args.steps, newer=SCHEMA_VERSION + 1)
    setup_django(url)

    from django.contrib.auth.models import User
    from django.test import Client
    from django.urls import reverse

    from agent_runtime.state import SCHEMA_VERSION
    from sessions_app.admin.registry import AgentSessionAdmin, LargeTableAdmin, LargeTablePaginator
    from sessions_app.models import AgentSession, ApiToken, AuditEvent, Checkpoint, Step

    user, _ = User.objects.get_or_create(
        username="bench", defaults={"is_superuser": True, "is_staff": True}
    )
    if not ApiToken.objects.exists():
        for n in range(50):
            ApiToken.issue(user, f"bench {n}")
    client = Client()
    client.force_login(user)

    def changelist(model: str) -> str:
        return reverse(f"admin:sessions_app_{model}_changelist")

    def change(model: str, pk) -> str:
        return reverse(f"admin:sessions_app_{model}_change", args=[pk])

    big = AgentSession.objects.order_by("-step_count").values_list("id", flat=True).first()
    small = (
        AgentSession.objects.filter(status="completed", step_count__lt=20)
        .values_list("id", flat=True)
        .first()
    )
    step = Step.objects.filter(session_id=small, kind="tool_result").values_list("pk", flat=True)[0]
    big_last = AgentSession.objects.filter(id=big).values_list("last_seq", flat=True)[0]
    big_step = Step.objects.filter(session_id=big, seq=big_last // 2).values_list("pk", flat=True)[
        0
    ]
    checkpoint = (
        Checkpoint.objects.filter(session_id=small).order_by("-seq").values_list("pk", flat=True)[0]
    )
    event = AuditEvent.objects.filter(session_id=small).values_list("pk", flat=True)[0]
    newest = AgentSession.objects.order_by("-created_at").values_list("created_at", flat=True)[0]
    rare_title = AgentSession.objects.filter(id=small).values_list("title", flat=True)[0]
    by_created = AgentSessionAdmin.list_display.index("created_at") + 1  # after the checkbox

    def last_page(rows) -> int:
        """The last page the admin offers for these rows (pages stop at max_rows)."""
        reachable = min(
            rows[: LargeTablePaginator.max_rows + 1].count(), LargeTablePaginator.max_rows
        )
        return max(1, -(-reachable // LargeTableAdmin.list_per_page))

    p_all = last_page(AgentSession.objects.all())
    p_failed = last_page(AgentSession.objects.filter(status="failed"))
    p_big = last_page(Step.objects.filter(session_id=big))
    p_steps = last_page(Step.objects.all())
    S, ST, CP, AU = (changelist(m) for m in ("agentsession", "step", "checkpoint", "auditevent"))
    pages = [
        ("admin index", reverse("admin:index")),
        ("sessions: first page", S),
        ("sessions: status=failed", f"{S}?status=failed"),
        ("sessions: agent=flaky", f"{S}?agent=flaky"),
        ("sessions: stuck", f"{S}?stuck=yes"),
        (f"sessions: head schema v{SCHEMA_VERSION}", f"{S}?head_version={SCHEMA_VERSION}"),
        ("sessions: head schema newer", f"{S}?head_version=newer"),
        ("sessions: search exact id", f"{S}?q={small}"),
        ("sessions: search title, common word", f"{S}?q=invoice"),
        ("sessions: search title, rare", f"{S}?q={rare_title.split()[-1]}"),
        ("sessions: year (date hierarchy)", f"{S}?created_at__year={newest.year}"),
        (
            "sessions: month (date hierarchy)",
            f"{S}?created_at__year={newest.year}&created_at__month={newest.month}",
        ),
        ("sessions: oldest first", f"{S}?o={by_created}"),
        (f"sessions: last page (p={p_all})", f"{S}?p={p_all}"),
        (f"sessions: failed, last page (p={p_failed})", f"{S}?status=failed&p={p_failed}"),
        ("session: change page", change("agentsession", small)),
        (f"session: change page ({big_last:,} steps)", change("agentsession", big)),
        ("steps: first page", ST),
        ("steps: kind=error", f"{ST}?kind=error"),
        ("steps: kind=tool_result", f"{ST}?kind=tool_result"),
        ("steps: schema newer", f"{ST}?schema_version=newer"),
        (f"steps: one session ({big_last:,})", f"{ST}?session={big}"),
        (f"steps: one session, last page (p={p_big})", f"{ST}?session={big}&p={p_big}"),
        ("steps: one session, kind=tool_result", f"{ST}?session={big}&kind=tool_result"),
        ("steps: small session", f"{ST}?session={small}"),
        ("steps: search session id", f"{ST}?q={small}"),
        (f"steps: last page (p={p_steps})", f"{ST}?p={p_steps}"),
        ("step: change page", change("step", step)),
        ("step: change page (big session)", change("step", big_step)),
        ("checkpoints: first page", CP),
        ("checkpoints: reason=before-rollback", f"{CP}?reason=before-rollback"),
        ("checkpoints: reason=auto", f"{CP}?reason=auto"),
        ("checkpoints: schema newer", f"{CP}?schema_version=newer"),
        (f"checkpoints: one session ({big_last:,} steps)", f"{CP}?session={big}"),
        ("checkpoint: change page", change("checkpoint", checkpoint)),
        ("audit: first page", AU),
        ("audit: action=rollback", f"{AU}?action=rollback"),
        ("audit: one session", f"{AU}?session={small}"),
        ("audit: year (date hierarchy)", f"{AU}?created_at__year={newest.year}"),
        ("audit event: change page", change("auditevent", event)),
        ("api tokens", changelist("apitoken")),
    ]
    print(f"\n{'page':44} {'median ms':>10} {'p95 ms':>8} {'queries':>8}")
    for name, path in pages:
        median, p95, queries = measure(client, path, args.rounds)
        print(f"{name:44} {median:10.2f} {p95:8.2f} {queries:8d}", flush=True)

    print("\nfor comparison, what Django's defaults would run on each list:")
    for name, sql in [
        ("COUNT(*) sessions", "SELECT COUNT(*) FROM sessions_app_agentsession"),
        ("COUNT(*) steps", "SELECT COUNT(*) FROM sessions_app_step"),
        ("COUNT(*) checkpoints", "SELECT COUNT(*) FROM sessions_app_checkpoint"),
        ("COUNT(*) audit events", "SELECT COUNT(*) FROM sessions_app_auditevent"),
        (
            "date hierarchy: DISTINCT months of sessions",
            "SELECT DISTINCT date_trunc('month', created_at) FROM sessions_app_agentsession",
        ),
    ]:
        print(f"{name:44} {raw_ms(sql):10.2f}", flush=True)


if __name__ == "__main__":
    main()
