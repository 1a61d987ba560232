"""Storage against session length: bytes per step at 50, 500 and 5,000 steps.

    python -m bench.storage [--lengths 50,500,5000] [--total 5000] [--peers]
                            [--payload-bytes 256] [--plot docs/storage.png]

For each session length L, every contender writes about `--total` steps in sessions of L
steps (100 sessions of 50, 10 of 500, 1 of 5,000), on tables emptied first, and the bench
reports what its tables (heap, TOAST and every index) grew by, per step, beside the size of
the step payloads themselves (their JSON text). Storage that is linear in session length
gives the same bytes per step at every L. The per-step time of the same runs is plotted too.

LangGraph's checkpoints copy the whole conversation at every step, so its storage and time
grow with the square of the length: it runs up to `--langgraph-max` steps per session
(default 500; 5,000 would write gigabytes).
"""

from __future__ import annotations

import argparse
import json
import statistics

from ._workload import warm


def payload_bytes_per_step(turns: int, payload_bytes: int) -> float:
    """The mean size of a step's payload as JSON text (what the client sends)."""
    from ._peers import floor_payloads

    payloads = floor_payloads(turns, payload_bytes)
    return statistics.mean(len(json.dumps(p).encode()) for p in payloads)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lengths", default="50,500,5000")
    parser.add_argument("--total", type=int, default=5000, help="steps per contender per length")
    parser.add_argument("--peers", action="store_true")
    parser.add_argument("--payload-bytes", type=int, default=256)
    parser.add_argument("--langgraph-max", type=int, default=500)
    parser.add_argument("--plot", default="docs/storage.png")
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]

    from . import steps as bench_steps
    from ._respawn import turns_for

    contenders = bench_steps.setup(args.payload_bytes, args.peers, "respawn_bench_storage")
    results: dict[str, dict[int, dict]] = {c.name: {} for c in contenders}
    try:
        for c in contenders:
            c.run(3)  # warm-up
        for length in lengths:
            turns = turns_for(length)
            warm(turns, args.payload_bytes)
            sessions = max(1, args.total // length)
            for c in contenders:
                if c.name.startswith("LangGraph") and length > args.langgraph_max:
                    continue
                timings, n, grown, wall = c.run(turns, sessions)
                results[c.name][length] = {
                    "steps": n,
                    "sessions": sessions,
                    "bytes_per_step": grown / n,
                    "bytes_per_turn": grown / (turns * sessions),
                    "p50": timings.p50,
                    "mean": wall / n * 1000,
                }
                print(
                    f"L={length:5d} {c.name:36} {sessions:4d} x {n // sessions:5d} steps: "
                    f"{grown / n:8.0f} B/step  p50 {timings.p50:.3f} ms",
                    flush=True,
                )
    finally:
        for c in contenders:
            if isinstance(c, bench_steps.Peer):
                c.peer.close()

    payload = {L: payload_bytes_per_step(turns_for(L), args.payload_bytes) for L in lengths}
    print(f"\npayload JSON per step (mean): {payload[lengths[-1]]:.0f} B")
    header = "".join(f"{f'L={L}':>12}" for L in lengths)
    print(f"{'bytes per step':36}{header}   last/first  x payload (last)")
    for name, by_length in results.items():
        row = "".join(
            f"{by_length[L]['bytes_per_step']:12.0f}" if L in by_length else f"{'-':>12}"
            for L in lengths
        )
        measured = [L for L in lengths if L in by_length]
        first, last = by_length[measured[0]], by_length[measured[-1]]
        growth = last["bytes_per_step"] / first["bytes_per_step"]
        times_payload = last["bytes_per_step"] / payload[measured[-1]]
        print(f"{name:36}{row}   {growth:10.2f}  {times_payload:8.2f}")
    print(f"{'ms per step (p50)':36}{header}")
    for name, by_length in results.items():
        row = "".join(
            f"{by_length[L]['p50']:12.3f}" if L in by_length else f"{'-':>12}" for L in lengths
        )
        print(f"{name:36}{row}")
    respawn = results[bench_steps.Respawn.name]
    growth = respawn[lengths[-1]]["bytes_per_step"] / respawn[lengths[0]]["bytes_per_step"]
    print(f"respawn_growth: {growth:.3f}")
    print(f"respawn_x_payload: {respawn[lengths[-1]]['bytes_per_step'] / payload[lengths[-1]]:.2f}")
    if args.plot:
        plot(results, lengths, args.plot, args.payload_bytes)
        print(f"plot: {args.plot}")


def plot(results, lengths, path: str, payload_bytes: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, by_length in results.items():
        xs = [L for L in lengths if L in by_length]
        left.plot(xs, [by_length[L]["bytes_per_step"] for L in xs], marker="o", label=name)
        right.plot(xs, [by_length[L]["p50"] for L in xs], marker="o", label=name)
    for ax, title, unit in (
        (left, "storage per step (log scale)", "bytes per step (heap + TOAST + indexes)"),
        (right, "time per durable step", "ms per step, p50"),
    ):
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xlabel("session length (steps)")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    left.set_yscale("log")
    left.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    right.set_ylim(bottom=0)
    left.legend(fontsize=8)
    fig.suptitle(
        f"Same workload, same PostgreSQL 15 (fsync on), {payload_bytes} B of text per payload",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
