"""Where a durable step's time goes: Respawn's loop against the floor, taken apart.

    python -m bench.profile_step [--steps 600] [--replays 600] [--profile]

1. split: one session through the real loop and Django store, timing separately the
   append statement's round trip (send, execute, commit, answer), the store's Python
   around it, and the engine between two appends (redaction, validation, state fold,
   conversation, the scripted model, the tool call and its thread).
2. statement: the exact statement the store sends for a tool result with its checkpoint
   and for a step without one, replayed (interleaved, `--replays` times each) on fresh
   databases with the full schema, without the foreign keys, and the floor's INSERT: the
   server's share. (The payload's full-text index left the append in migration 0018: the workers
   index steps in batches, sessions_app.upkeep.search.)
3. with --profile: a pyinstrument profile of the same loop (needs the bench extra).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid

from ._db import fresh_database, setup_django
from ._workload import warm

DB_NAME = "respawn_bench_profile"


def split(steps: int) -> dict[str, float]:
    import sessions_app.store.postgresql as store_module

    from . import _respawn

    turns = _respawn.turns_for(steps)
    warm(turns, 256)
    executes: list[float] = []
    inside: list[float] = []
    between: list[float] = []
    last = [None]
    execute = store_module._execute_prepared
    append = store_module.DjangoSessionStore.append

    def timed_execute(sql, params):
        started = time.perf_counter()
        try:
            return execute(sql, params)
        finally:
            executes.append(time.perf_counter() - started)

    def timed_append(self, *args, **kwargs):
        started = time.perf_counter()
        if last[0] is not None:
            between.append(started - last[0])
        try:
            return append(self, *args, **kwargs)
        finally:
            last[0] = time.perf_counter()
            inside.append(last[0] - started)

    store_module._execute_prepared = timed_execute
    store_module.DjangoSessionStore.append = timed_append
    try:
        _respawn.truncate()
        _respawn.run(_respawn.create_session(3), 256)  # warm-up
        executes.clear(), inside.clear(), between.clear()
        last[0] = None
        session_id = _respawn.create_session(turns)
        started = time.perf_counter()
        cpu = time.process_time()
        _respawn.run(session_id, 256)
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu
    finally:
        store_module._execute_prepared = execute
        store_module.DjangoSessionStore.append = append
    n = len(inside)
    # The claim and load_head go through _execute_prepared too: only the appends' count.
    appends = executes[-n:]
    return {
        "steps": n,
        "per_step": wall / n * 1000,
        "cpu_per_step": cpu / n * 1000,
        "statement": statistics.median(appends) * 1000,
        "store_python": statistics.median(i - e for i, e in zip(inside, appends, strict=True))
        * 1000,
        "engine": statistics.median(between) * 1000,
    }


def captured_statements() -> dict[str, tuple[str, list]]:
    """The statements the store sends for a tool result with and without a checkpoint."""
    import sessions_app.store.postgresql as store_module
    from agent_runtime.state import NewCheckpoint, NewStep, SessionState, StepKind

    from . import _respawn
    from ._peers import floor_payloads

    payload = floor_payloads(3, 256)[4]
    captured: dict[str, tuple[str, list]] = {}
    execute = store_module._execute_prepared
    from sessions_app.store import session_store

    store = session_store()
    session_id = _respawn.create_session(1)
    lease = store.claim(session_id, "profile", 60)
    try:
        for name, checkpoint in (("with checkpoint", True), ("without", False)):
            store_module._execute_prepared = lambda sql, params, name=name: (
                captured.__setitem__(name, (sql, params)) or (1, False)
            )
            store.append(
                lease,
                [NewStep(kind=StepKind.TOOL_RESULT, payload=payload)],
                checkpoint=NewCheckpoint(state=SessionState("bench", "1")) if checkpoint else None,
            )
    finally:
        store_module._execute_prepared = execute
    return captured


# The schema variants the statement is replayed on: DDL run after the migrations (None:
# the floor's own table).
VARIANTS: dict[str, list[str] | None] = {
    "full schema": [],
    "without the foreign keys": [
        "ALTER TABLE sessions_app_step DROP CONSTRAINT sessions_app_step_session_id_7805be21_fk_sessions_",
        "ALTER TABLE sessions_app_checkpoint DROP CONSTRAINT sessions_app_checkpo_session_id_dd84c42b_fk_sessions_",
    ],
    "floor (INSERT of the payload)": None,
}


def statement_ab(
    rounds: int = 600,
    variants: dict[str, list[str] | None] | None = None,
    *,
    flush: bool = True,
) -> dict[str, float]:
    """Median ms per execution on each variant. flush=False replays with
    synchronous_commit off: the server's work without the WAL flush, which on a loaded
    machine can take milliseconds and hide every difference between the variants."""
    import psycopg

    from ._peers import floor_payloads

    statements = captured_statements()
    sql_ckpt, params_ckpt = statements["with checkpoint"]
    sql_plain, params_plain = statements["without"]
    variants = VARIANTS if variants is None else variants
    payload = floor_payloads(3, 256)[4]
    conns = {}
    sid = uuid.uuid4()
    for index, (name, ddl) in enumerate(variants.items()):
        url = fresh_database(f"{DB_NAME}_ab{index}", migrate=ddl is not None)
        conn = psycopg.connect(url, autocommit=True)
        if not flush:
            conn.execute("SET synchronous_commit = off")
        if ddl is None:
            conn.execute(
                "CREATE TABLE floor_step (session_id uuid, seq integer, payload jsonb,"
                " PRIMARY KEY (session_id, seq))"
            )
        else:
            for statement in ddl:
                conn.execute(statement)
            conn.execute(
                "INSERT INTO sessions_app_agentsession (id, agent, title, status, head, last_seq,"
                " fencing_token, cancel_requested, job_id, last_error, step_count, tokens_in,"
                " tokens_out, cost, final_answer, created_at, updated_at, crash_count, crash_seq,"
                " incompatible_reason, lease_owner) VALUES (%s, 'bench', '', 'running', 0, 0, 1,"
                " false, '', '', 0, 0, 0, 0, '', now(), now(), 0, -1, '', 'profile')",
                (sid,),
            )
        conns[name] = conn

    def rebind(params):
        # The captured statement's session id, token and owner -> this database's session.
        out = list(params)
        for i, value in enumerate(out):
            if isinstance(value, str) and len(value) == 36 and value.count("-") == 4:
                out[i] = str(sid)
        return out

    ckpt, plain = rebind(params_ckpt), rebind(params_plain)
    times: dict[str, list[float]] = {name: [] for name in conns}
    text = json.dumps(payload)
    for i in range(rounds):
        for name, conn in conns.items():
            started = time.perf_counter()
            if name.startswith("floor"):
                conn.execute("INSERT INTO floor_step VALUES (%s, %s, %s::jsonb)", (sid, i, text))
            elif i % 3 == 2:
                conn.execute(sql_ckpt, ckpt, prepare=True).fetchone()
            else:
                conn.execute(sql_plain, plain, prepare=True).fetchone()
            times[name].append(time.perf_counter() - started)
    for conn in conns.values():
        conn.close()
    return {name: statistics.median(t) * 1000 for name, t in times.items()}


def profile(steps: int) -> str:
    from pyinstrument import Profiler

    from . import _respawn

    turns = _respawn.turns_for(steps)
    session_id = _respawn.create_session(turns)
    profiler = Profiler(interval=0.0005)
    profiler.start()
    _respawn.run(session_id, 256)
    profiler.stop()
    return profiler.output_text(unicode=False, color=False)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument(
        "--replays", type=int, default=600, help="executions of the statement per variant"
    )
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    url = fresh_database(DB_NAME)
    setup_django(url)
    parts = split(args.steps)
    print(
        f"Respawn loop, {parts['steps']} steps: {parts['per_step']:.3f} ms/step (mean), "
        f"CPU {parts['cpu_per_step']:.3f} ms/step\n"
        f"  append statement round trip (p50)   {parts['statement']:.3f} ms\n"
        f"  store's Python around it (p50)      {parts['store_python']:.3f} ms\n"
        f"  engine between two appends (p50)    {parts['engine']:.3f} ms",
        flush=True,
    )
    print("\nthe append statement alone, replayed (p50 per execution, checkpoint every third):")
    for name, ms in statement_ab(args.replays).items():
        print(f"  {name:40} {ms:.3f} ms")
    print("... and without the WAL flush (synchronous_commit off): the server's work")
    for name, ms in statement_ab(args.replays, flush=False).items():
        print(f"  {name:40} {ms:.3f} ms")
    if args.profile:
        print()
        print(profile(args.steps))


if __name__ == "__main__":
    main()
