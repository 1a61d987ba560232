"""LangGraph on Respawn: the same graph with RespawnSaver and with the official
PostgresSaver, side by side in one run.

    python -m bench.langgraph                  # 50, 500 and 5,000 steps
    python -m bench.langgraph --steps 50 500   # some of them

The graph is bench/_peers.py's: a model node and a tools node in a loop (zero-latency,
scripted), the conversation in a list channel, durability="sync" (a checkpoint committed
after every node). A step is one node run; ms per step is the time from one node start to
the next (p50, p99); bytes per step is what the saver's tables grew by, divided by the
steps. Each saver has a database of its own (BENCH_DATABASE_URL or DATABASE_URL names the
server), its tables emptied before every run. Needs the `bench` extra.

Then the checkpointer's own calls, side by side: the median ms of every `put` and
`put_writes` the run made, of `get_tuple` of the thread's latest checkpoint and of `list`
of the whole thread (what time travel and `get_state_history` wait on), read back
`--reads` times after the run; and RespawnSaver's time over PostgresSaver's per call.
Last, what starting a thread costs (a program, and each of LangGraph's tests, starts one
every time): the median ms of `get_tuple` of a thread that is not there and of the first
and second `put` of it, over `--threads` new threads.
"""

from __future__ import annotations

import argparse
import json
import operator
import statistics
import time
import uuid
from collections import defaultdict
from typing import Annotated, Any, TypedDict

import psycopg

from ._db import fresh_database, setup_django
from ._workload import Timings, model_text, table_bytes, tool_output, warm

RESPAWN_TABLES = [
    "sessions_app_agentsession",
    "sessions_app_step",
    "sessions_app_checkpoint",
    "sessions_app_graphthread",
    "sessions_app_graphcheckpoint",
    "sessions_app_graphblob",
    "sessions_app_graphwrite",
]
POSTGRES_TABLES = ["checkpoints", "checkpoint_blobs", "checkpoint_writes"]


class _State(TypedDict):
    messages: Annotated[list, operator.add]
    turn: int
    turns: int


def build_graph(saver: Any, payload_bytes: int, clock: dict[str, Timings]) -> Any:
    from langgraph.graph import END, START, StateGraph

    def model(state: _State) -> dict[str, Any]:
        clock["t"].mark()
        turn = state["turn"]
        calls = (
            [{"id": f"call_{turn}", "name": "echo_n", "args": {"n": turn}}]
            if turn < state["turns"]
            else []
        )
        return {
            "messages": [
                {
                    "role": "assistant",
                    "content": model_text(turn, payload_bytes),
                    "tool_calls": calls,
                }
            ]
        }

    def tools(state: _State) -> dict[str, Any]:
        clock["t"].mark()
        call = state["messages"][-1]["tool_calls"][0]
        content = json.dumps(tool_output(call["args"]["n"], payload_bytes))
        return {
            "messages": [{"role": "tool", "tool_call_id": call["id"], "content": content}],
            "turn": state["turn"] + 1,
        }

    def route(state: _State) -> str:
        return "tools" if state["messages"][-1]["tool_calls"] else END

    graph = StateGraph(_State)
    graph.add_node("model", model)
    graph.add_node("tools", tools)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, ["tools", END])
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=saver)


CALLS = ["put", "put_writes", "get_tuple", "list"]


class CallTimer:
    """The time of each call a graph makes to a checkpointer (its put and put_writes)."""

    def __init__(self) -> None:
        self.ms: dict[str, list[float]] = defaultdict(list)

    def wrap(self, saver: Any, name: str) -> None:
        original = getattr(saver, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.ms[name].append((time.perf_counter() - started) * 1000)

        setattr(saver, name, timed)


def read_back(saver: Any, thread_id: str, reads: int) -> dict[str, list[float]]:
    """ms of get_tuple (the latest checkpoint) and list (the whole thread), `reads` times."""
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    out: dict[str, list[float]] = defaultdict(list)
    for _ in range(reads):
        started = time.perf_counter()
        saver.get_tuple(config)
        out["get_tuple"].append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        listed = builtins_list(saver.list(config))
        out["list"].append((time.perf_counter() - started) * 1000)
        out["listed"].append(len(listed))
    return out


builtins_list = list


NEW_THREAD_CALLS = ["get_tuple", "first put", "second put"]


def new_threads(saver: Any, threads: int) -> dict[str, float]:
    """Median ms of what starting a thread costs: get_tuple of a thread that is not there
    (what a graph's first invoke reads), then its first and second put."""
    from langgraph.checkpoint.base import empty_checkpoint

    ms: dict[str, list[float]] = defaultdict(list)
    for _ in range(threads):
        config = {"configurable": {"thread_id": f"new-{uuid.uuid4()}", "checkpoint_ns": ""}}
        started = time.perf_counter()
        saver.get_tuple(config)
        ms["get_tuple"].append((time.perf_counter() - started) * 1000)
        for step, call in enumerate(("first put", "second put")):
            metadata = {"source": "input" if step == 0 else "loop", "step": step - 1}
            started = time.perf_counter()
            config = saver.put(config, empty_checkpoint(), metadata, {})
            ms[call].append((time.perf_counter() - started) * 1000)
    return {call: statistics.median(values) for call, values in ms.items()}


def run_once(graph: Any, url: str, tables: list[str], steps: int, clock: dict) -> dict[str, Any]:
    turns = (steps - 1) // 2  # 2 nodes a turn and the final answer
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {', '.join(tables)} CASCADE")
        before = table_bytes(conn, tables)
    timings = Timings()
    clock["t"] = timings
    config = {"configurable": {"thread_id": str(uuid.uuid4())}, "recursion_limit": 2 * turns + 10}
    timings.start()
    state = graph.invoke(
        {"messages": [{"role": "user", "content": f"run {turns}"}], "turn": 0, "turns": turns},
        config,
        durability="sync",
    )
    nodes = len(state["messages"]) - 1
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        grown = table_bytes(conn, tables) - before
    return {
        "steps": nodes,
        "p50": timings.p50,
        "p99": timings.p99,
        "bytes_per_step": grown / nodes,
        "thread_id": config["configurable"]["thread_id"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[50, 500, 5000])
    parser.add_argument("--payload-bytes", type=int, default=200)
    parser.add_argument("--reads", type=int, default=9, help="get_tuple/list calls timed")
    parser.add_argument("--threads", type=int, default=30, help="new threads timed")
    args = parser.parse_args()

    respawn_url = fresh_database("respawn_bench_langgraph_respawn")
    postgres_url = fresh_database("respawn_bench_langgraph_postgres", migrate=False)
    setup_django(respawn_url)
    from langgraph.checkpoint.postgres import PostgresSaver

    from sessions_app.langgraph.saver import RespawnSaver

    warm(max(args.steps), args.payload_bytes)
    clock: dict[str, Timings] = {}
    print(f"payload {args.payload_bytes} B per message; durability=sync\n")
    print(f"{'steps':>6}  {'saver':<14} {'p50 ms':>8} {'p99 ms':>8} {'bytes/step':>12}")
    with (
        PostgresSaver.from_conn_string(postgres_url) as postgres,
        RespawnSaver.from_conn_string(respawn_url) as respawn,
    ):
        postgres.setup()
        respawn.setup()
        timer = {"RespawnSaver": CallTimer(), "PostgresSaver": CallTimer()}
        savers = {"RespawnSaver": respawn, "PostgresSaver": postgres}
        for name, saver in savers.items():
            for call in ("put", "put_writes"):
                timer[name].wrap(saver, call)
        contenders = [
            (
                "RespawnSaver",
                build_graph(respawn, args.payload_bytes, clock),
                respawn_url,
                RESPAWN_TABLES,
            ),
            (
                "PostgresSaver",
                build_graph(postgres, args.payload_bytes, clock),
                postgres_url,
                POSTGRES_TABLES,
            ),
        ]
        calls: dict[int, dict[str, dict[str, float]]] = {}
        for steps in args.steps:
            for name, graph, url, tables in contenders:
                timer[name].ms.clear()
                result = run_once(graph, url, tables, steps, clock)
                print(
                    f"{result['steps']:>6}  {name:<14} {result['p50']:>8.2f} {result['p99']:>8.2f}"
                    f" {result['bytes_per_step']:>12,.0f}",
                    flush=True,
                )
                reads = read_back(savers[name], result["thread_id"], args.reads)
                medians = {c: statistics.median(timer[name].ms[c]) for c in ("put", "put_writes")}
                medians.update({c: statistics.median(reads[c]) for c in ("get_tuple", "list")})
                medians["listed"] = reads["listed"][0]
                calls.setdefault(result["steps"], {})[name] = medians
        print("\nper call, median ms (list: the whole thread)")
        print(f"{'steps':>6}  {'saver':<14}" + "".join(f" {c:>11}" for c in CALLS) + "  listed")
        for steps, by_saver in calls.items():
            for name, medians in by_saver.items():
                print(
                    f"{steps:>6}  {name:<14}"
                    + "".join(f" {medians[c]:>11.3f}" for c in CALLS)
                    + f"  {medians['listed']:>6}"
                )
            ratios = [by_saver["RespawnSaver"][c] / by_saver["PostgresSaver"][c] for c in CALLS]
            print(f"{steps:>6}  {'Respawn/PG':<14}" + "".join(f" {r:>10.2f}x" for r in ratios))
        started = {name: new_threads(saver, args.threads) for name, saver in savers.items()}
        print(f"\na new thread, median ms over {args.threads}")
        print(f"{'saver':<14}" + "".join(f" {c:>11}" for c in NEW_THREAD_CALLS))
        for name, medians in started.items():
            print(f"{name:<14}" + "".join(f" {medians[c]:>11.3f}" for c in NEW_THREAD_CALLS))
        ratios = [
            started["RespawnSaver"][c] / started["PostgresSaver"][c] for c in NEW_THREAD_CALLS
        ]
        print(f"{'Respawn/PG':<14}" + "".join(f" {r:>10.2f}x" for r in ratios))


if __name__ == "__main__":
    main()
