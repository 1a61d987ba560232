"""Durable per-step time: the PostgreSQL floor, Respawn's loop and (with --peers) LangGraph
+ PostgresSaver and DBOS, side by side, interleaved in rounds.

    python -m bench.steps --steps 300 [--rounds 5] [--peers] [--payload-bytes 256]

Every contender runs the same session (a scripted zero-latency model, a trivial tool, one
tool call per turn) with every step committed before the next starts, on the same
PostgreSQL server, each in a database of its own with its tables emptied before each run.
The order of the contenders rotates from round to round, so that a noisy neighbour on a
shared machine hits all of them alike. ms/step is the time from one durable step to the
next (p50, p99 over all steps of the round); "x floor" divides a contender's p50 by the
floor's p50 of the same round. The table shows the median over the rounds. The last line,
`ratio_to_floor: X`, is Respawn's median ratio.

Respawn runs `agent_runtime.loop.run_session` in process (no RQ) with DjangoSessionStore.
Its steps per turn are three (model, tool call recorded before the tool runs, tool result
with the turn's checkpoint) in two commits (the model's answer with the record of the call
it asks for, then the result with the checkpoint); the peers write two steps a turn (model
node/step, tool node/step), each its own commit.

Two floors: `floor`, a bare INSERT + COMMIT per step, and `fenced floor`, the least a
fenced durable step costs (one statement that advances a session row's sequence only where
its fencing token matches, and inserts the step). Each contender is reported against both
per step (p50), and per turn against two fenced-floor commits (x 2F: the turn's wall time
over twice the fenced floor's mean step): the least a turn that commits the model's answer
with its call, then the result with the checkpoint, can cost.
"""

from __future__ import annotations

import argparse
import statistics
import time

from ._db import fresh_database, server_url, setup_django, with_db
from ._workload import Timings, table_bytes, warm

DB_NAME = "respawn_bench_steps"  # the peers' databases: its name + _langgraph, + _dbos


class Contender:
    name = ""
    payload_bytes = 0

    def run(self, turns: int, sessions: int = 1) -> tuple[Timings, int, int, float]:
        """Run `sessions` sessions of `turns` turns one after the other, on tables emptied
        first: (timings, steps, bytes the tables grew by, wall seconds)."""
        raise NotImplementedError


class Floor(Contender):
    name = "floor (psycopg INSERT+COMMIT)"

    def __init__(self, url: str, payload_bytes: int) -> None:
        from ._peers import floor_setup

        self.url = url
        self.payload_bytes = payload_bytes
        floor_setup(url)

    def run(self, turns, sessions=1):
        from ._peers import floor_run

        timings = Timings()
        started = time.perf_counter()
        steps, grown = floor_run(self.url, turns, self.payload_bytes, timings, sessions)
        return timings, steps, grown, time.perf_counter() - started


class FencedFloor(Contender):
    name = "fenced floor (UPDATE fence+INSERT)"

    def __init__(self, url: str, payload_bytes: int) -> None:
        from ._peers import fenced_floor_setup

        self.url = url
        self.payload_bytes = payload_bytes
        fenced_floor_setup(url)

    def run(self, turns, sessions=1):
        from ._peers import fenced_floor_run

        timings = Timings()
        started = time.perf_counter()
        steps, grown = fenced_floor_run(self.url, turns, self.payload_bytes, timings, sessions)
        return timings, steps, grown, time.perf_counter() - started


class Respawn(Contender):
    name = "Respawn loop (DjangoSessionStore)"

    def __init__(self, url: str, payload_bytes: int) -> None:
        self.url = url
        self.payload_bytes = payload_bytes

    def run(self, turns, sessions=1):
        import psycopg

        from sessions_app.models import AgentSession

        from . import _respawn

        _respawn.truncate()
        with psycopg.connect(self.url, autocommit=True) as conn:
            before = table_bytes(conn, _respawn.TABLES)
        timings = Timings()
        wall = 0.0
        for _ in range(sessions):
            session_id = _respawn.create_session(turns)
            started = time.perf_counter()
            result = _respawn.run(session_id, self.payload_bytes, timings)
            wall += time.perf_counter() - started
            assert result.outcome == "completed", result
        steps = sum(AgentSession.objects.values_list("last_seq", flat=True))
        # What the workers' search indexer adds after the steps, off the append path:
        # its bytes count as the steps', its time is reported apart.
        from sessions_app.upkeep import search

        at = time.perf_counter()
        while search.index_pending(budget=60).behind:
            pass
        self.index_ms_per_step = (time.perf_counter() - at) * 1000 / max(steps, 1)
        with psycopg.connect(self.url, autocommit=True) as conn:
            grown = table_bytes(conn, _respawn.TABLES) - before
        return timings, steps, grown, wall


class Peer(Contender):
    def __init__(self, name: str, peer) -> None:
        self.name = name
        self.peer = peer
        self.payload_bytes = peer.payload_bytes

    def run(self, turns, sessions=1):
        self.peer.truncate()
        before = self.peer.bytes()
        timings = Timings()
        steps = 0
        wall = 0.0
        for _ in range(sessions):
            started = time.perf_counter()
            steps += self.peer.run(turns, timings)
            wall += time.perf_counter() - started
        return timings, steps, self.peer.bytes() - before, wall


def setup(payload_bytes: int, peers: bool, database: str = DB_NAME) -> list[Contender]:
    """The contenders, each on a fresh database named after `database` (a bench of its own
    that runs them, bench.storage, names its own)."""
    url = fresh_database(database)
    setup_django(url)
    contenders: list[Contender] = [
        Floor(url, payload_bytes),
        FencedFloor(url, payload_bytes),
        Respawn(url, payload_bytes),
    ]
    if peers:
        from ._peers import DBOSPeer, LangGraphPeer

        lg_url = fresh_database(f"{database}_langgraph", migrate=False)
        contenders.append(
            Peer("LangGraph + PostgresSaver (sync)", LangGraphPeer(lg_url, payload_bytes))
        )
        dbos_url = fresh_database(f"{database}_dbos", migrate=False)
        contenders.append(Peer("DBOS workflow + steps", DBOSPeer(dbos_url, payload_bytes)))
    return contenders


def rounds(contenders: list[Contender], steps: int, n_rounds: int) -> dict[str, list[dict]]:
    from ._respawn import turns_for

    turns = turns_for(steps)
    warm(turns, contenders[0].payload_bytes)
    results: dict[str, list[dict]] = {c.name: [] for c in contenders}
    for c in contenders:  # warm-up: connections, imports, prepared statements
        c.run(3)
    for r in range(n_rounds):
        order = contenders[r % len(contenders) :] + contenders[: r % len(contenders)]
        for c in order:
            timings, n, grown, wall = c.run(turns)
            results[c.name].append(
                {
                    "p50": timings.p50,
                    "p99": timings.p99,
                    "mean": wall / n * 1000,
                    "steps": n,
                    "turn_ms": wall / turns * 1000,
                    "bytes_per_step": grown / n,
                }
            )
        floor = results[contenders[0].name][-1]["p50"]
        fenced = results[contenders[1].name][-1]
        # A turn of two fenced commits: the least a durable turn (the model's answer and
        # the call it asks for, then the result with the checkpoint) can cost.
        two_commits = 2 * fenced["mean"]
        for c in contenders:
            row = results[c.name][-1]
            row["ratio"] = row["p50"] / floor
            row["ratio_fenced"] = row["p50"] / fenced["p50"]
            row["turn_ratio"] = row["turn_ms"] / two_commits
        line = "  ".join(
            f"{c.name.split()[0]} {results[c.name][-1]['p50']:.3f}" for c in contenders
        )
        print(f"round {r + 1}/{n_rounds}: p50 ms/step  {line}", flush=True)
    return results


def report(results: dict[str, list[dict]], respawn: str) -> float:
    def med(name, key):
        return statistics.median(r[key] for r in results[name])

    print(
        f"\n{'contender':36} {'steps':>6} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} "
        f"{'x floor':>8} {'x fenced':>8} {'ms/turn':>8} {'x 2F':>6} {'B/step':>8}"
    )
    names = list(results)
    floors = names[:2]
    for name in results:
        # The floors write every step apart: a turn of theirs is three commits, not a turn.
        turn_ratio = f"{'-':>6}" if name in floors else f"{med(name, 'turn_ratio'):6.2f}"
        print(
            f"{name:36} {int(med(name, 'steps')):6d} {med(name, 'p50'):8.3f} "
            f"{med(name, 'p99'):8.3f} {med(name, 'mean'):8.3f} {med(name, 'ratio'):8.2f} "
            f"{med(name, 'ratio_fenced'):8.2f} {med(name, 'turn_ms'):8.3f} "
            f"{turn_ratio} {med(name, 'bytes_per_step'):8.0f}"
        )
    print(
        "x floor, x fenced: p50 per step over the floor's and the fenced floor's; x 2F: the"
        " time of a turn over two fenced-floor commits (its mean step, twice)"
    )
    for peer in names[3:]:
        per_step = [
            p["p50"] / r["p50"] for p, r in zip(results[peer], results[respawn], strict=True)
        ]
        per_turn = [
            p["turn_ms"] / r["turn_ms"]
            for p, r in zip(results[peer], results[respawn], strict=True)
        ]
        print(
            f"{peer} / Respawn (median of rounds): per step {statistics.median(per_step):.1f}x,"
            f" per turn {statistics.median(per_turn):.1f}x"
        )
    for floor in floors:
        bytes_ratio = med(respawn, "bytes_per_step") / med(floor, "bytes_per_step")
        print(f"Respawn's bytes per step over the {floor.split(' (')[0]}'s: {bytes_ratio:.2f}x")
    ratio = med(respawn, "ratio")
    print(f"turn_ratio_to_two_fenced_commits: {med(respawn, 'turn_ratio'):.2f}")
    print(f"ratio_to_fenced_floor: {med(respawn, 'ratio_fenced'):.2f}")
    print(f"ratio_to_floor: {ratio:.2f}")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=300, help="steps per session (about)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--peers", action="store_true", help="also LangGraph and DBOS")
    parser.add_argument("--payload-bytes", type=int, default=256)
    args = parser.parse_args()
    print(
        f"server {with_db(server_url(), '')}  steps/session ~{args.steps}  rounds {args.rounds}  "
        f"payload text {args.payload_bytes} B",
        flush=True,
    )
    contenders = setup(args.payload_bytes, args.peers)
    try:
        results = rounds(contenders, args.steps, args.rounds)
    finally:
        for c in contenders:
            if isinstance(c, Peer):
                c.peer.close()
    report(results, Respawn.name)


if __name__ == "__main__":
    main()
