"""Every benchmark the docs cite (`python -m bench.X`) runs, as a person runs it: a program
of its own at its tiniest size, on the test server's PostgreSQL and the test Redis, and
prints its figures. Nothing here judges the figures; a bench that no longer runs, or runs
and prints none, fails here instead of the day someone re-measures.

The benches of the run start together, a few at a time, in the background: most of a tiny
bench's time is spent starting servers and workers and waiting for them, and one after the
other they took minutes on two cores. What each prints is its own figures either way.
"""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor

import psycopg
import pytest

from ..conftest import ROOT, database_url, program_env

AT_ONCE = 3  # benches running at once
# The test database is set up only for a run with tests that ask for it; its name names
# the benches' databases (and the benches never touch it).
pytestmark = pytest.mark.django_db
# (bench, its tiniest arguments, a line of figures it must print), the slowest first. Each
# bench makes databases of its own on the server, named by RESPAWN_BENCH_DB_PREFIX below.
NUMBER = r"[\d,]+(?:\.\d+)?"
CASES = [
    ("fleet", ["--sessions", "3", "--workers", "1", "--ticks", "2", "--lock-seconds", "2"],
     r"^durable steps +[1-9]\d*$"),  # it exits 1 when a step is lost or doubled
    ("pooler", ["--workers", "1", "--sessions", "2", "--turns", "2", "--repeat", "1",
                "--pool-size", "1"],
     rf"^\| 1 \| {NUMBER} \| [1-9]\d* \| {NUMBER} \| {NUMBER} \| [1-9]\d* \|"),
    ("soak", ["--kills", "2", "--sessions", "3", "--ticks", "2", "--workers", "1",
              "--interval", "0.2", "0.3"],
     r"^steps +[1-9]\d*$"),  # it exits 1 when a step is lost or doubled
    ("recovery", ["--rounds", "1", "--resume-steps", "20", "--resume-rounds", "1"],
     rf"^recovery_max_s: {NUMBER}$"),
    ("fanout", ["--branches", "2", "--delay", "0.01", "--workers", "1", "--repeat", "1"],
     rf"^  speed-up: tool turn {NUMBER}x, session {NUMBER}x$"),
    ("storage", ["--lengths", "20", "--total", "40", "--peers", "--plot", ""],
     rf"^respawn_x_payload: {NUMBER}$"),
    ("admin", ["--sessions", "40", "--steps", "400", "--rounds", "1"],
     rf"^sessions: first page +{NUMBER} +{NUMBER} +\d+$"),
    ("state_text", ["--steps", "900", "--appenders", "1", "--batch", "100"],
     rf"^longest_wait_ms: {NUMBER}$"),
    ("upgrade", ["--rows", "40", "--batch-size", "20"],
     rf"^  upgrade_state \(to v\d+\) +40 rows in +{NUMBER}s = +{NUMBER} rows/s"),
    ("concurrency", ["--turns", "3", "--sessions", "1,2", "--rounds", "1"],
     rf"^respawn_vs_peers_at_2: langgraph {NUMBER}x \(p99 {NUMBER}x\)"
     rf"  dbos {NUMBER}x \(p99 {NUMBER}x\)$"),
    ("steps", ["--steps", "60", "--rounds", "1", "--peers"],
     rf"^DBOS workflow \+ steps / Respawn \(median of rounds\): per step {NUMBER}x,"
     rf" per turn {NUMBER}x$"),
    ("langgraph", ["--steps", "12", "--threads", "3"],
     rf"^ +\d+ +RespawnSaver +{NUMBER} +{NUMBER} +{NUMBER}$"),
    ("throughput", ["--workers", "1", "--sessions", "2", "--turns", "2", "--latency", "2"],
     rf"^steps_per_second: {NUMBER}$"),
    ("openai_session", ["--turns", "3", "--rounds", "1"],
     rf"^ratio_add: {NUMBER}$"),
    ("profile_step", ["--steps", "20", "--replays", "10"],
     rf"^  append statement round trip \(p50\) +{NUMBER} ms$"),
    ("dashboard", ["--sessions", "40", "--steps", "400", "--rounds", "1"],
     rf"^needs attention +{NUMBER} +{NUMBER} +\d+$"),
    ("batches", ["--records", "40", "--batch", "10", "--repeat", "1"],
     rf"^  durable / plain: {NUMBER}x the time$"),
    ("retention", ["--sessions", "12", "--steps", "120", "--baseline-seconds", "0.3"],
     rf"^retention pass: {NUMBER} rows deleted in {NUMBER}s"),
    ("costs", ["--steps", "20", "--rounds", "1"],
     rf"^usage \+ metrics \+ traces +{NUMBER} +{NUMBER}$"),
]  # fmt: skip


def latency_percentiles_in_order(out: str) -> None:
    """bench.throughput's latency line: p50 <= p90 <= max (its p90 was once the least of
    a few samples)."""
    found = re.search(rf"p50 ({NUMBER}) ms +p90 ({NUMBER}) ms +max ({NUMBER}) ms", out)
    assert found, out
    p50, p90, most = (float(x.replace(",", "")) for x in found.groups())
    assert p50 <= p90 <= most, found.group(0)


def new_thread_costs_printed(out: str) -> None:
    """bench.langgraph's last table: what starting a thread costs, with each saver."""
    for saver in ("RespawnSaver", "PostgresSaver"):
        assert re.search(rf"^{saver} +{NUMBER} +{NUMBER} +{NUMBER}$", out, re.MULTILINE), out


def concurrency_rows_sane(out: str) -> None:
    """bench.concurrency's table (run with --turns 3 --sessions 1,2): a row for every level
    and contender, with every turn of every session done, turns/s above zero and p50 <= p99
    (then a session's time, its own and PostgreSQL's CPU per turn, the machine's busy
    share); and the ratios at each level."""
    for sessions in (1, 2):
        for name in ("Respawn", "LangGraph", "DBOS"):
            found = re.search(
                rf"^ +{sessions}  {name}\b.*? +(\d+) +({NUMBER}) +({NUMBER}) +({NUMBER})"
                rf" +{NUMBER} +{NUMBER} +{NUMBER} +\d+%$",
                out,
                re.MULTILINE,
            )
            assert found, f"no row for {name} at {sessions} sessions:\n{out}"
            turns, per_second, p50, p99 = (float(x.replace(",", "")) for x in found.groups())
            assert turns == 3 * sessions, found.group(0)
            assert per_second > 0 and 0 < p50 <= p99, found.group(0)
        assert re.search(rf"^respawn_vs_peers_at_{sessions}: langgraph {NUMBER}x", out, re.M)


# What some benches print is checked further than one figure line.
FURTHER_CHECKS = {
    "concurrency": concurrency_rows_sane,
    "throughput": latency_percentiles_in_order,
    "langgraph": new_thread_costs_printed,
}


def cited_benches() -> set[str]:
    """The benches README.md and docs/*.md tell people to run."""
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *ROOT.glob("docs/*.md")])
    return set(re.findall(r"python -m bench\.(\w+)", text))


def test_every_cited_bench_is_run_here():
    assert cited_benches() == {name for name, _, _ in CASES}


@pytest.fixture(scope="module")
def bench_env(django_db_setup, django_db_blocker):
    """The environment of a bench: the test server and Redis, bench databases under a
    prefix of the test database's name, all dropped afterwards."""
    with django_db_blocker.unblock():
        server, _, test_database = database_url().rpartition("/")
    # Every database under the prefix is dropped below: never one but the test run's own.
    assert test_database.startswith("test_"), f"{test_database} is not a test database"
    prefix = f"{test_database}_bench"
    yield program_env(RESPAWN_BENCH_DB_PREFIX=prefix)
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        names = conn.execute(
            "SELECT datname FROM pg_database WHERE left(datname, %s) = %s",
            [len(prefix), prefix],
        ).fetchall()
        for (name,) in names:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run_bench(name: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", f"bench.{name}", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.fixture(scope="module")
def bench_runs(request, bench_env):
    """The benches this run selected, started in the background (the order of CASES, the
    slowest first), AT_ONCE at a time; each test waits for its own."""
    selected = {
        item.callspec.params["name"]
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec")
    }
    pool = ThreadPoolExecutor(max_workers=AT_ONCE)
    runs: dict[str, Future] = {
        name: pool.submit(run_bench, name, args, bench_env)
        for name, args, _ in CASES
        if name in selected
    }
    yield runs
    pool.shutdown(cancel_futures=True)


@pytest.mark.integration
@pytest.mark.parametrize(("name", "args", "figure"), [pytest.param(*c, id=c[0]) for c in CASES])
def test_bench_runs_and_prints_its_figures(bench_runs, name, args, figure):
    done = bench_runs[name].result()
    assert done.returncode == 0, f"bench.{name} exited {done.returncode}:\n{done.stderr}"
    assert re.search(figure, done.stdout, re.MULTILINE), (
        f"bench.{name} printed no line matching {figure!r}:\n{done.stdout}"
    )
    if name in FURTHER_CHECKS:
        FURTHER_CHECKS[name](done.stdout)
