"""Throughput under concurrency: 1, 8 and 32 sessions at once on N processes, Respawn beside
LangGraph + PostgresSaver and DBOS, on the same PostgreSQL server.

    python -m bench.concurrency [--sessions 1,8,32] [--processes 2] [--turns 200]
                                [--rounds 5] [--payload-bytes 256]

Every contender runs the workload of bench.steps (`_workload.py`, `_peers.py`,
`_respawn.py`): a scripted zero-latency model that answers with one tool call a turn, a
tool that returns its argument and some text; each turn commits the model's answer and the
tool's result (with Respawn, the turn's checkpoint too) before the next turn starts.

Every contender runs the same way: for each run, `--processes` OS processes of its own (2
by default; a process with no session to run is not started), each running its share of
the sessions at once, one thread a session. The processes start outside the timing and
warm up (a two-turn session on each of their threads at once: connections opened,
statements prepared), then wait for a start time the parent sets; they end after the run,
so that only the running contender holds PostgreSQL connections (32 sessions take 32 or
more; the server is shared). Each contender has a fresh database of its own on the same
server, its tables emptied before every run, after the warm-up.

- Respawn: its engine as a worker runs it (`agent_runtime.loop.run_session` with the
  Django store: the lease, the heartbeat thread, the fenced appends, the redactor, a
  checkpoint a turn), each thread on its own Django connection, and in each process the
  search indexer thread a worker runs beside its jobs; a run ends when the search index
  has caught up with its steps too, so the indexer's work counts in Respawn's time. Not
  through RQ: a Respawn worker runs one session at a time, so two real rqworkers would
  run 2 of the 32 sessions at once while the peers run 32; bench.throughput measures the
  real workers and what RQ adds. The session row and its first step are created inside
  the measured time, as the peers create theirs.
- LangGraph + PostgresSaver (durability="sync"): one compiled graph and one saver per
  process, the saver on a psycopg pool of one connection per thread.
- DBOS: launched once per process, each under an executor id of its own (under DBOS's
  default, "local", a process launching takes over the other's running workflows), the
  workflow called in each thread; DBOS's own connection pool.

A run is one concurrency level for one contender: the sessions start together (at a time
the parent sets, every process waiting for it) and the run ends with the last session's
last commit (Respawn: with its search index caught up). turns/s is the turns of all
sessions over that time. A turn's time is the time from one model call of a session to its
next (the answer and its call committed, the tool run, its result committed): median and
p99 over every turn of the run. Where the time goes: the CPU time of the contender's
processes, and of the PostgreSQL backends connected to its database when the run starts,
per turn; and how busy the machine was. Each round runs every level, and within a level
every contender, in an order that rotates from round to round, so that a noisy neighbour
hits all of them alike; the table shows the median of the rounds, and the ratios are the
medians of the per-round ratios. The last lines, `respawn_vs_peers_at_<sessions>: ...`,
are Respawn's turns/s over each peer's at each level.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ._db import fresh_database, server_url, setup_django, with_db
from .throughput import _machine_busy

DB_NAME = "respawn_bench_concurrency"  # + _respawn, _langgraph, _dbos
CONTENDERS = {
    "respawn": "Respawn (run_session, Django store)",
    "langgraph": "LangGraph + PostgresSaver (sync)",
    "dbos": "DBOS workflow + steps",
}
LANGGRAPH_TABLES = ["checkpoints", "checkpoint_blobs", "checkpoint_writes"]


# --- in each contender's process ----------------------------------------------------------


class Stamps:
    """The Timings interface the peers mark at each step; keeps the times themselves."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def start(self) -> None:
        pass

    def mark(self) -> None:
        self.times.append(time.perf_counter())


class RespawnRunner:
    def __init__(self, url: str, payload_bytes: int) -> None:
        setup_django(url)
        from . import _respawn

        self.payload_bytes = payload_bytes
        self.agents = _respawn.agents(payload_bytes)
        self.stop = threading.Event()
        threading.Thread(target=self._index, name="search-indexer", daemon=True).start()

    def _index(self) -> None:
        """The worker's search indexer thread (sessions_app.workers.worker.SearchIndexer)."""
        from django.conf import settings

        from sessions_app.upkeep.search import index_pending

        while not self.stop.wait(settings.RESPAWN_SEARCH_INTERVAL):
            try:
                index_pending()
            except Exception:  # a TRUNCATE between runs; the next pass goes on
                from django.db import connection

                connection.close()

    def session(self, turns: int) -> list[float]:
        """One session; the times of its model calls."""
        from agent_runtime.loop import run_session
        from sessions_app.store import DjangoEffects, session_store

        from . import _respawn

        stamps = Stamps()

        class StampedModel(_respawn.BenchModel):
            def complete(self, messages, tools, settings):
                stamps.mark()
                return super().complete(messages, tools, settings)

        model = StampedModel(self.payload_bytes)
        session_id = _respawn.create_session(turns)
        result = run_session(
            session_id,
            store=session_store(),
            agents=self.agents,
            effects=DjangoEffects(),
            config=_respawn.run_config(),
            make_provider=lambda spec, options: (model, "scripted"),
        )
        assert result.outcome == "completed", result
        return stamps.times

    def catch_up(self) -> None:
        """Until the search index has every step written so far (another process indexing
        meanwhile: wait for it, then look again)."""
        from sessions_app.upkeep.search import index_pending

        while True:
            done = index_pending(budget=60)
            if done.locked_out:
                time.sleep(0.002)
            elif not done.behind:
                return

    def close(self) -> None:
        self.stop.set()


class PeerRunner:
    def __init__(self, peer) -> None:
        self.peer = peer

    def catch_up(self) -> None:
        pass  # nothing written off the sessions' path

    def session(self, turns: int) -> list[float]:
        stamps = Stamps()
        steps = self.peer.run(turns, stamps)
        assert steps == 2 * turns + 1, steps
        return stamps.times[0::2]  # model, tool, model, ..., model: the model calls

    def close(self) -> None:
        self.peer.close()


def make_runner(kind: str, url: str, payload_bytes: int, threads: int):
    if kind == "respawn":
        return RespawnRunner(url, payload_bytes)
    from ._peers import DBOSPeer, LangGraphPeer

    if kind == "langgraph":
        return PeerRunner(LangGraphPeer(url, payload_bytes, pool_size=max(threads, 1)))
    return PeerRunner(DBOSPeer(url, payload_bytes, executor_id=f"bench-{os.getpid()}"))


def child(kind: str, url: str, payload_bytes: int, sessions: int, turns: int, conn) -> None:
    """A contender's process for one run: set up, warm up (a short session on each of its
    threads at once: its connections opened, its statements prepared), tell the parent,
    wait for the start time it sends, run `sessions` sessions at once, send the figures."""
    from ._workload import warm

    warm(turns, payload_bytes)
    runner = make_runner(kind, url, payload_bytes, sessions)
    pool = ThreadPoolExecutor(max_workers=max(sessions, 1))
    try:
        together = threading.Barrier(sessions)

        def warm_up():
            together.wait()  # one on each thread
            runner.session(2)

        for f in [pool.submit(warm_up) for _ in range(sessions)]:
            f.result()
        conn.send("ready")
        start_at = conn.recv()

        def one():
            began = time.perf_counter()
            stamps = runner.session(turns)
            return began, stamps, time.perf_counter()

        time.sleep(max(0.0, start_at - time.time()))
        offset = time.time() - time.perf_counter()  # perf_counter -> wall clock
        cpu = time.process_time()  # this process's, all its threads
        futures = [pool.submit(one) for _ in range(sessions)]
        results = [f.result() for f in futures]
        runner.catch_up()
        conn.send(
            {
                "cpu": time.process_time() - cpu,
                "indexed": time.time(),
                "turn_times": [
                    b - a for _, s, _ in results for a, b in zip(s, s[1:], strict=False)
                ],
                "session_times": [end - began for began, _, end in results],
                "end": max(end for _, _, end in results) + offset,
                "turns": sum(len(s) - 1 for _, s, _ in results),
            }
        )
        conn.recv()  # until the parent has read its PostgreSQL backends' CPU time
    finally:
        pool.shutdown()
        runner.close()


# --- the parent -------------------------------------------------------------------------


class Contender:
    """A contender on its database: its processes are started for each run (outside the
    timing) and end with it, so only the running contender holds connections."""

    def __init__(self, kind: str, url: str, processes: int, payload_bytes: int):
        self.kind = kind
        self.name = CONTENDERS[kind]
        self.url = url
        self.processes = processes
        self.payload_bytes = payload_bytes
        self.context = multiprocessing.get_context("spawn")
        self.run(1, 1)  # one process alone first: it creates the tables (LangGraph, DBOS)

    def _start(self, shares: list[int], turns: int):
        started = []
        for i, share in enumerate(shares):
            ours, theirs = self.context.Pipe()
            process = self.context.Process(
                target=child,
                args=(self.kind, self.url, self.payload_bytes, share, turns, theirs),
                name=f"{self.kind}-{i + 1}",
                daemon=True,
            )
            process.start()
            started.append((ours, process))
        for pipe, process in started:
            if not pipe.poll(180):
                raise RuntimeError(f"{process.name} did not start (exit code {process.exitcode})")
            assert pipe.recv() == "ready"
        return started

    def truncate(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            if self.kind == "respawn":
                from ._respawn import TABLES

                conn.execute(f"TRUNCATE {', '.join(TABLES)} CASCADE")
                conn.execute("DELETE FROM sessions_app_searchcursor")
            elif self.kind == "langgraph":
                conn.execute(f"TRUNCATE {', '.join(LANGGRAPH_TABLES)}")
            else:
                conn.execute("TRUNCATE dbos.workflow_status, dbos.operation_outputs CASCADE")

    def run(self, sessions: int, turns: int) -> dict:
        """`sessions` sessions of `turns` turns at once, spread over the processes."""
        n = self.processes
        shares = [sessions // n + (1 if i < sessions % n else 0) for i in range(n)]
        started = self._start([s for s in shares if s], turns)
        try:
            self.truncate()
            start_at = time.time() + 0.2
            for pipe, _ in started:
                pipe.send(start_at)
            backends = _backends(self.url)
            time.sleep(max(0.0, start_at - time.time()))
            busy0, total0 = _machine_busy()
            server0 = _cpu_of(backends)
            parts = []
            for pipe, process in started:
                while not pipe.poll(1.0):
                    if not process.is_alive():
                        raise RuntimeError(f"{process.name} exited with {process.exitcode}")
                parts.append(pipe.recv())
            busy1, total1 = _machine_busy()
            server1 = _cpu_of(backends)
            for pipe, _ in started:
                pipe.send(None)
        finally:
            for _, process in started:
                process.join(30)
                if process.is_alive():
                    process.kill()
        turn_times = sorted(t for p in parts for t in p["turn_times"])
        done = sum(p["turns"] for p in parts)
        assert done == sessions * turns, (done, sessions, turns)
        # Respawn: until its search index has every step too (its indexer's work counts)
        wall = max(p["indexed"] for p in parts) - start_at
        return {
            "catch_up": wall - (max(p["end"] for p in parts) - start_at),
            "turns": done,
            "wall": wall,
            "turns_per_s": done / wall,
            "p50": statistics.median(turn_times) * 1000,
            "p99": turn_times[min(len(turn_times) - 1, math.ceil(0.99 * len(turn_times)) - 1)]
            * 1000,
            "session_p50": statistics.median(t for p in parts for t in p["session_times"]),
            "cpu_per_turn": sum(p["cpu"] for p in parts) / done * 1000,
            "server_cpu_per_turn": sum(server1[pid] - server0[pid] for pid in server1)
            / done
            * 1000,
            "machine_busy": (busy1 - busy0) / (total1 - total0),
        }


def _backends(url: str) -> list[int]:
    """The PostgreSQL backends (process ids) connected to the database at `url`."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return [pid for (pid,) in rows]


def _cpu_of(pids: list[int]) -> dict[int, float]:
    """CPU seconds (user + system) of each process still there."""
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu[pid] = (int(fields[11]) + int(fields[12])) / ticks
    return cpu


def measure(contenders: list[Contender], levels: list[int], turns: int, n_rounds: int):
    results: dict[int, dict[str, list[dict]]] = {
        level: {c.kind: [] for c in contenders} for level in levels
    }
    for r in range(n_rounds):
        for level in levels:
            k = (r + levels.index(level)) % len(contenders)
            for c in contenders[k:] + contenders[:k]:
                row = c.run(level, turns)
                results[level][c.kind].append(row)
            line = "  ".join(
                f"{c.kind} {results[level][c.kind][-1]['turns_per_s']:,.0f}" for c in contenders
            )
            print(f"round {r + 1}/{n_rounds}, {level} sessions: turns/s  {line}", flush=True)
    return results


def report(results, contenders: list[Contender], processes: int, turns: int) -> None:
    def med(rows, key):
        return statistics.median(row[key] for row in rows)

    print(
        f"\n{'sessions':>8}  {'contender':36} {'turns':>6} {'turns/s':>8} {'p50 ms':>8} "
        f"{'p99 ms':>8} {'session s':>9} {'CPU ms/turn':>11} {'PG ms/turn':>10} {'machine':>7}"
    )
    for level, by_kind in results.items():
        for c in contenders:
            rows = by_kind[c.kind]
            print(
                f"{level:8d}  {c.name:36} {int(med(rows, 'turns')):6d} "
                f"{med(rows, 'turns_per_s'):8.1f} {med(rows, 'p50'):8.2f} "
                f"{med(rows, 'p99'):8.2f} {med(rows, 'session_p50'):9.3f} "
                f"{med(rows, 'cpu_per_turn'):11.2f} {med(rows, 'server_cpu_per_turn'):10.2f} "
                f"{med(rows, 'machine_busy'):7.0%}"
            )
    print(
        f"({processes} processes a contender, one thread a session, {turns} turns a session;"
        " medians of the rounds; session s: a session's time, median; CPU ms/turn: the"
        " contender's processes' CPU time over its turns; PG ms/turn: that of the PostgreSQL"
        " backends connected to its database at the start;"
        " machine: how busy the machine's CPUs were, every process of every user)"
    )
    catch_up = ", ".join(
        f"{level}: {med(by_kind['respawn'], 'catch_up') * 1000:.0f} ms"
        for level, by_kind in results.items()
    )
    print(
        "Respawn's search index caught up after its last session (counted in its time), "
        f"median: {catch_up}"
    )
    peers = [c for c in contenders if c.kind != "respawn"]
    for level, by_kind in results.items():
        ratios = []
        for peer in peers:
            per_round = [
                r["turns_per_s"] / p["turns_per_s"]
                for r, p in zip(by_kind["respawn"], by_kind[peer.kind], strict=True)
            ]
            p99 = [
                p["p99"] / r["p99"]
                for r, p in zip(by_kind["respawn"], by_kind[peer.kind], strict=True)
            ]
            ratios.append(
                f"{peer.kind} {statistics.median(per_round):.2f}x"
                f" (p99 {statistics.median(p99):.2f}x)"
            )
        print(f"respawn_vs_peers_at_{level}: {'  '.join(ratios)}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", default="1,8,32", help="concurrency levels, e.g. 1,8,32")
    parser.add_argument("--processes", type=int, default=2, help="OS processes a contender")
    parser.add_argument("--turns", type=int, default=200, help="turns a session")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--payload-bytes", type=int, default=256)
    parser.add_argument(
        "--contenders", default="respawn,langgraph,dbos", help="a subset, e.g. respawn,dbos"
    )
    args = parser.parse_args()
    levels = [int(x) for x in args.sessions.split(",")]
    kinds = [k for k in args.contenders.split(",") if k]
    assert "respawn" in kinds and set(kinds) <= set(CONTENDERS), kinds
    print(
        f"server {with_db(server_url(), '')}  sessions {args.sessions}  processes "
        f"{args.processes} a contender  turns/session {args.turns}  rounds {args.rounds}  "
        f"payload text {args.payload_bytes} B",
        flush=True,
    )
    contenders = [
        Contender(
            kind,
            fresh_database(f"{DB_NAME}_{kind}", migrate=kind == "respawn"),
            args.processes,
            args.payload_bytes,
        )
        for kind in kinds
    ]
    results = measure(contenders, levels, args.turns, args.rounds)
    report(results, contenders, args.processes, args.turns)


if __name__ == "__main__":
    main()
