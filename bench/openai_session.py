"""The OpenAI Agents SDK's session calls: RespawnSession (PostgreSQL, every item a step of
the trace, fenced and redacted) beside the SDK's own SQLiteSession (a file), side by side,
interleaved in rounds.

    python -m bench.openai_session [--turns 200] [--rounds 3]

Each contender keeps one conversation of `turns` turns with the calls a `Runner.run` makes
per turn with tools: read the history (`get_items()`), add the user input, add a tool call
with its output, add the answer. Both are called through the SDK's async protocol from an
event loop, as the SDK calls them. Printed: p50 and p99 ms per call of each kind over all
turns of a round, the median over the rounds, and the ratio of RespawnSession's p50 to
SQLiteSession's (`ratio_add: X`, `ratio_get: X`).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from ._db import fresh_database, setup_django

DB = "respawn_bench_openai_session"


def _turn_items(n: int) -> tuple[list, list, list]:
    user = [{"role": "user", "content": f"question {n}: where is order O-{n}?"}]
    tool = [
        {
            "type": "function_call",
            "call_id": f"c{n}",
            "name": "lookup",
            "arguments": f'{{"order": "O-{n}"}}',
        },
        {"type": "function_call_output", "call_id": f"c{n}", "output": f"O-{n} shipped"},
    ]
    answer = [
        {
            "type": "message",
            "role": "assistant",
            "id": f"m{n}",
            "status": "completed",
            "content": [{"type": "output_text", "text": f"O-{n} has shipped.", "annotations": []}],
        }
    ]
    return user, tool, answer


async def _conversation(session, turns: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"get_items": [], "add_items": []}
    for n in range(turns):
        user, tool, answer = _turn_items(n)
        started = time.perf_counter()
        await session.get_items()
        times["get_items"].append(time.perf_counter() - started)
        for items in (user, tool, answer):
            started = time.perf_counter()
            await session.add_items(items)
            times["add_items"].append(time.perf_counter() - started)
    items = await session.get_items()
    assert len(items) == 4 * turns, len(items)
    return times


def run_respawn(turns: int, name: str) -> dict[str, list[float]]:
    from sessions_app.openai_agents.session import RespawnSession

    session = RespawnSession(name)
    try:
        return asyncio.run(_conversation(session, turns))
    finally:
        session.close()


def run_sqlite(turns: int, name: str, directory: Path) -> dict[str, list[float]]:
    from agents import SQLiteSession

    session = SQLiteSession(name, str(directory / f"{name}.sqlite3"))
    try:
        return asyncio.run(_conversation(session, turns))
    finally:
        session.close()


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    setup_django(fresh_database(DB))
    rows: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        run_respawn(5, "warm-up")
        run_sqlite(5, "warm-up", Path(tmp))
        for round_ in range(args.rounds):
            contenders = [
                ("RespawnSession (PostgreSQL)", lambda r=round_: run_respawn(args.turns, f"r{r}")),
                (
                    "SQLiteSession (file)",
                    lambda r=round_: run_sqlite(args.turns, f"r{r}", Path(tmp)),
                ),
            ]
            if round_ % 2:
                contenders.reverse()
            for name, run in contenders:
                times = run()
                row = rows.setdefault(name, {})
                for kind, values in times.items():
                    row.setdefault(f"{kind} p50", []).append(_p(values, 0.5))
                    row.setdefault(f"{kind} p99", []).append(_p(values, 0.99))
    columns = ["get_items p50", "get_items p99", "add_items p50", "add_items p99"]
    print(
        f"{args.turns} turns ({4 * args.turns} items) per round, {args.rounds} rounds; ms per call, median over rounds"
    )
    print(f"{'contender':30} " + " ".join(f"{c:>14}" for c in columns))
    medians = {}
    for name, row in rows.items():
        medians[name] = {c: statistics.median(row[c]) for c in columns}
        print(f"{name:30} " + " ".join(f"{medians[name][c]:14.3f}" for c in columns))
    respawn, sqlite = medians["RespawnSession (PostgreSQL)"], medians["SQLiteSession (file)"]
    print(f"ratio_add: {respawn['add_items p50'] / sqlite['add_items p50']:.2f}")
    print(f"ratio_get: {respawn['get_items p50'] / sqlite['get_items p50']:.2f}")


if __name__ == "__main__":
    main()
