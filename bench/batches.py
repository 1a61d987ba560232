"""Batch throughput: records per second of the migrate demo agent with a checkpoint after
every batch, against the same batches with no durability at all. Prints both and their
ratio (the overhead of durability).

    python -m bench.batches [--records 10000] [--batch 100] [--repeat 3] [--keep]

Three ways to migrate N records in batches of B, each on a fresh dataset in the same table:
  plain    the batches alone: DjangoRecords.migrate_batch in a loop (no session, no steps)
  engine   the agent loop on the in-memory store (model turns, no durable steps/checkpoints)
  durable  the agent loop on the Django store: per batch a model step, a tool_call step and
           a tool_result step with its checkpoint, every write fenced (what workers do)
All run in this process (no RQ): the figure is the cost of the writes, not of a queue.
Creates its own database (respawn_bench_batches) on the server DATABASE_URL points at.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

from ._db import drop_database, fresh_database, setup_django

BENCH_DB = "respawn_bench_batches"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args()
    url = fresh_database(BENCH_DB)
    setup_django(url)

    from agent_runtime.loop import Outcome, RunConfig, run_session
    from agent_runtime.state import user_payload
    from agent_runtime.store import InMemoryEffects, InMemoryStore
    from demo_agents import demo_agents
    from sessions_app.models import AgentSession, DemoRecord, Step
    from sessions_app.store import DjangoEffects, DjangoRecords, session_store

    n, size = args.records, args.batch
    task = f"migrate {n} records in batches of {size}"
    agents = demo_agents(slow_delay=0, batch_delay=0)
    records = DjangoRecords()

    def plain() -> tuple[float, str]:
        dataset = uuid.uuid4().hex
        records.ensure(dataset, n)
        start = time.perf_counter()
        for cursor in range(0, n, size):
            records.ensure(dataset, n)  # the tool checks this per batch too
            records.migrate_batch(
                f"{dataset}:{cursor}", dataset=dataset, start=cursor, size=min(size, n - cursor)
            )
        return time.perf_counter() - start, dataset

    def engine() -> tuple[float, str]:
        store = InMemoryStore()
        session_id = str(uuid.uuid4())
        store.create_session(session_id, "migrate", task)
        records.ensure(session_id, n)
        start = time.perf_counter()
        result = run_session(
            session_id,
            store=store,
            agents=agents,
            effects=InMemoryEffects(),
            config=RunConfig(worker_id="bench", lease_ttl=60),
            records=records,
        )
        assert result.outcome == Outcome.COMPLETED, result
        return time.perf_counter() - start, session_id

    def durable() -> tuple[float, str]:
        session = AgentSession.objects.create(agent="migrate", last_seq=1, step_count=1)
        Step.objects.create(session=session, seq=1, kind="user", payload=user_payload(task))
        records.ensure(str(session.id), n)
        start = time.perf_counter()
        result = run_session(
            str(session.id),
            store=session_store(),
            agents=agents,
            effects=DjangoEffects(),
            config=RunConfig(worker_id="bench", lease_ttl=60),
            records=records,
        )
        assert result.outcome == Outcome.COMPLETED, result
        return time.perf_counter() - start, str(session.id)

    times: dict[str, list[float]] = {"plain": [], "engine": [], "durable": []}
    for _ in range(args.repeat):
        for name, fn in (("plain", plain), ("engine", engine), ("durable", durable)):
            seconds, dataset = fn()
            migrated = DemoRecord.objects.filter(dataset=dataset, migrations=1).count()
            assert migrated == n, (name, migrated)
            times[name].append(seconds)
    print(f"{n} records in batches of {size}, best of {args.repeat}:")
    best = {name: min(values) for name, values in times.items()}
    for name, seconds in best.items():
        spread = statistics.median(times[name])
        print(
            f"  {name:8s} {seconds:7.2f} s  {n / seconds:8.0f} records/s  (median {spread:.2f} s)"
        )
    print(f"  durable / plain: {best['durable'] / best['plain']:.2f}x the time")
    print(f"  durable / engine: {best['durable'] / best['engine']:.2f}x the time")
    if not args.keep:
        from django.db import connections

        connections.close_all()
        drop_database(BENCH_DB)


if __name__ == "__main__":
    main()
