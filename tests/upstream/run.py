"""LangGraph's and the OpenAI Agents SDK's own tests against Respawn's adapters.

    python tests/upstream/run.py                  # both suites
    python tests/upstream/run.py langgraph        # one of them
    python tests/upstream/run.py openai-agents -x -k limit   # extra arguments go to pytest

The tests are taken from the source distribution of the installed version of each package
(`pip download --no-binary :all:` from pip's configured index, version read from the
installed metadata), kept under var/upstream/ and reused by the next run; nothing of theirs
is in this repository. Each suite runs as its own pytest process, in its own source tree
(their rootdir, their conftest and pytest configuration), with a plugin of ours
(tests/upstream/respawn_<suite>.py) that hands their tests Respawn's adapter on the test
database and marks the tests listed in tests/upstream/not_applicable.toml skipped, with
each one's reason. The exit status is non-zero when any suite has a failure.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CACHE = ROOT / "var" / "upstream"


@dataclass(frozen=True)
class Suite:
    name: str  # as on the command line, and the distribution's name
    plugin: str  # our pytest plugin, a module in tests/upstream
    tests: str  # the directory of their tests, in their source tree
    # A test file is selected when its text matches: the tests that take a checkpointer or
    # a session (the plugin then keeps only the tests that do, among their others).
    selects: str
    # Test files never selected (their subject is another store, not the adapter's).
    excludes: tuple[str, ...] = ()
    # How many pytest processes share its files: the tests wait on the database far more
    # than they compute, so processes side by side finish sooner on two CPUs.
    shards: int = 1


SUITES = {
    "langgraph": Suite(
        name="langgraph",
        plugin="respawn_langgraph",
        tests="tests",
        selects=r"\b(sync|async)_checkpointer\b",
        shards=2,
    ),
    "openai-agents": Suite(
        name="openai-agents",
        plugin="respawn_openai_agents",
        tests="tests",
        selects=r"\bSQLiteSession\b",
        # Other stores' own tests (SQLAlchemy, Redis, Dapr, MongoDB, the SDK's
        # advanced and async SQLite sessions), sandboxes, and what importing the SDK
        # does (in a subprocess, where SQLiteSession is only a name).
        excludes=("tests/extensions/", "tests/sandbox/", "tests/tracing/"),
    ),
}


class FetchError(RuntimeError):
    pass


def installed_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError as exc:
        raise FetchError(f"{dist} is not installed (make install installs it)") from exc


def source_tree(dist: str) -> Path:
    """The extracted source distribution of the installed version of `dist`, downloaded
    into var/upstream/ the first time and reused afterwards."""
    version = installed_version(dist)
    key = re.sub(r"[-_.]+", "_", dist).lower()
    tree = CACHE / f"{key}-{version}"
    if (tree / ".complete").exists():
        return tree
    downloads = CACHE / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    archive = _archive(downloads, key, version)
    if archive is None:
        print(f"Downloading the source distribution of {dist} {version}", flush=True)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--dest",
                str(downloads),
                f"{dist}=={version}",
            ],
            check=False,
        )
        archive = _archive(downloads, key, version)
        if done.returncode or archive is None:
            raise FetchError(
                f"could not download the source distribution of {dist} {version} "
                f"(pip download exited {done.returncode})"
            )
    with tempfile.TemporaryDirectory(dir=CACHE) as scratch:
        with tarfile.open(archive) as tar:
            tar.extractall(scratch, filter="data")
        (top,) = Path(scratch).iterdir()
        if tree.exists():
            shutil.rmtree(tree)
        top.rename(tree)
    (tree / ".complete").write_text(f"{archive.name}\n")
    return tree


def _archive(downloads: Path, key: str, version: str) -> Path | None:
    for path in downloads.glob("*.tar.gz"):
        name = re.sub(r"[-_.]+", "_", path.name[: -len(f"-{version}.tar.gz")]).lower()
        if path.name.endswith(f"-{version}.tar.gz") and name == key:
            return path
    return None


def selected_files(tree: Path, suite: Suite) -> list[tuple[str, int]]:
    """The suite's test files that match, each with how often (a measure of its size)."""
    pattern = re.compile(suite.selects)
    files = []
    for path in sorted((tree / suite.tests).rglob("test_*.py")):
        relative = path.relative_to(tree).as_posix()
        if relative.startswith(suite.excludes):
            continue
        found = len(pattern.findall(path.read_text(encoding="utf-8")))
        if found:
            files.append((relative, found))
    return files


def shards(files: list[tuple[str, int]], count: int) -> list[list[str]]:
    """The files dealt into `count` shards of about the same size, largest first."""
    dealt: list[tuple[int, list[str]]] = [(0, []) for _ in range(count)]
    for name, size in sorted(files, key=lambda f: -f[1]):
        total, names = min(dealt, key=lambda d: d[0])
        dealt.remove((total, names))
        dealt.append((total + size, [*names, name]))
    return [sorted(names) for _, names in dealt if names]


def start(suite: Suite, shard: str, files: list[str], extra: list[str], log) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    env.setdefault("DJANGO_SETTINGS_MODULE", "config.settings_test")
    # Each process's own test database is named after it.
    env["RESPAWN_UPSTREAM_RUN"] = re.sub(r"\W+", "_", shard)
    # LangGraph's fixtures: the stores and caches that need no server of theirs.
    env["NO_DOCKER"] = "true"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        suite.plugin,
        "-p",
        "no:cacheprovider",
        "-q",
        "--no-header",
        *files,
        *extra,
    ]
    log.write(f"{shard}: {len(files)} test files of {suite.name} {installed_version(suite.name)}\n")
    log.flush()
    tree = source_tree(suite.name)
    return subprocess.Popen(command, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)


SUMMARY = re.compile(
    r"own tests: (\d+) passed, (\d+) failed, (\d+) not applicable .*, (\d+) skipped by"
)


def split_arguments(argv: list[str]) -> tuple[list[str], list[str]]:
    """Suites first (all of them when none is named), then pytest's arguments: in
    `openai-agents -k langgraph`, "langgraph" is an argument of pytest's."""
    count = next((i for i, a in enumerate(argv) if a not in SUITES), len(argv))
    return argv[:count] or list(SUITES), argv[count:]


def main(argv: list[str]) -> int:
    names, extra = split_arguments(argv)
    plan: list[tuple[Suite, str, list[str]]] = []
    for name in names:
        suite = SUITES[name]
        try:
            tree = source_tree(name)
        except FetchError as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            return 2
        files = selected_files(tree, suite)
        if not files:
            print(f"{name}: no test file matches {suite.selects!r} in {tree}", file=sys.stderr)
            return 2
        dealt = shards(files, suite.shards)
        for index, part in enumerate(dealt, 1):
            plan.append((suite, name if len(dealt) == 1 else f"{name}-{index}", part))
    # Side by side, each on a test database of its own; each one's output follows when it
    # ends, then the counts per suite.
    print(
        f"The own tests of {', '.join(names)} against Respawn's adapters, in {len(plan)} "
        "pytest processes (var/upstream/)",
        flush=True,
    )
    failed: list[str] = []
    totals: dict[str, list[int]] = {name: [0, 0, 0, 0] for name in names}
    with tempfile.TemporaryDirectory() as logs:
        runs = []
        for suite, shard, files in plan:
            log = open(Path(logs) / f"{shard}.log", "w+")  # noqa: SIM115
            runs.append((suite, shard, start(suite, shard, files, extra, log), log))
        for suite, shard, process, log in runs:
            code = process.wait()
            log.seek(0)
            output = log.read()
            log.close()
            sys.stdout.write(output)
            for match in SUMMARY.finditer(output):
                for i, value in enumerate(match.groups()):
                    totals[suite.name][i] += int(value)
            # 5: no test collected, as when -k leaves none in one shard (and if none in any
            # shard of the suite, its count below is all zeros: a failure too).
            if code not in (0, 5):
                failed.append(f"{shard} (pytest exited {code})")
    for name, (passed, failures, listed, skipped) in totals.items():
        if not passed + failures + listed + skipped:
            failed.append(f"{name} (no test ran)")
        print(
            f"{name} {installed_version(name)}: {passed} passed, {failures} failed, "
            f"{listed} not applicable (tests/upstream/not_applicable.toml), "
            f"{skipped} skipped by the suite itself"
        )
    sys.stdout.flush()
    if failed:
        print("The frameworks' own tests failed: " + ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
