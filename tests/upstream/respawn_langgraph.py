"""Our pytest plugin for LangGraph's own tests (tests/upstream/run.py langgraph).

LangGraph's tests take a checkpointer from two fixtures of their conftest,
`sync_checkpointer` and `async_checkpointer`, parametrised over the savers they ship. This
plugin puts ours in their place, parametrised over "respawn" (RespawnSaver and
AsyncRespawnSaver on Respawn's test database, emptied after each test) and, with
RESPAWN_UPSTREAM_REFERENCE=memory (or 1), their in-memory reference saver, or with
RESPAWN_UPSTREAM_REFERENCE=postgres, their PostgresSaver (on a database of its own on the
same server, emptied after each test); a run with a reference ends with the time the
tests both passed took with each saver. The tests that take neither fixture are
deselected; the listed ones that do not apply are skipped with their reason
(tests/upstream/not_applicable.toml).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

import psycopg
import pytest
import respawn_upstream

SUITE = "langgraph"
FIXTURES = ("sync_checkpointer", "async_checkpointer")
REFERENCES = ("memory", "postgres")
REFERENCE = respawn_upstream.reference()
PARAMS = ["respawn", REFERENCE] if REFERENCE else ["respawn"]
POSTGRES_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")


respawn_test_database = respawn_upstream.respawn_test_database
respawn_database = respawn_upstream.respawn_database


class _Checkpointers:
    """The replacements for their conftest's checkpointer fixtures (not fixtures of this
    plugin itself: they take effect in their conftest's place)."""

    @staticmethod
    @pytest.fixture(name="sync_checkpointer", params=PARAMS)
    def sync_checkpointer(request, respawn_database):
        if request.param == "memory":
            from tests.conftest_checkpointer import _checkpointer_memory

            with _checkpointer_memory() as checkpointer:
                yield checkpointer
            return
        if request.param == "postgres":
            from langgraph.checkpoint.postgres import PostgresSaver

            url = request.getfixturevalue("postgres_reference")
            with PostgresSaver.from_conn_string(url) as checkpointer:
                yield checkpointer
            return
        from sessions_app.langgraph import RespawnSaver

        saver = RespawnSaver()
        try:
            yield saver
        finally:
            saver.close()

    @staticmethod
    @pytest.fixture(name="async_checkpointer", params=PARAMS)
    async def async_checkpointer(request, respawn_database):
        if request.param == "memory":
            from tests.conftest_checkpointer import _checkpointer_memory

            with _checkpointer_memory() as checkpointer:
                yield checkpointer
            return
        if request.param == "postgres":
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

            url = request.getfixturevalue("postgres_reference")
            async with AsyncPostgresSaver.from_conn_string(url) as checkpointer:
                yield checkpointer
            return
        from sessions_app.langgraph import AsyncRespawnSaver

        saver = AsyncRespawnSaver()
        try:
            yield saver
        finally:
            await asyncio.to_thread(saver.close)


@pytest.fixture(scope="session")
def postgres_reference_database(respawn_test_database):
    """A database beside Respawn's test database for PostgresSaver, its tables made once."""
    from django.db import connections
    from langgraph.checkpoint.postgres import PostgresSaver

    settings = connections["default"].settings_dict
    name = f"{settings['TEST']['NAME']}_postgres_saver"
    server = psycopg.conninfo.make_conninfo(
        host=settings["HOST"] or None,
        port=settings["PORT"] or None,
        user=settings["USER"] or None,
        password=settings["PASSWORD"] or None,
        dbname="postgres",
    )
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = psycopg.conninfo.make_conninfo(server, dbname=name)
    with PostgresSaver.from_conn_string(url) as saver:
        saver.setup()
    yield url
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def postgres_reference(postgres_reference_database):
    """PostgresSaver's database, emptied after each test (their tests reuse thread ids)."""
    yield postgres_reference_database
    with psycopg.connect(postgres_reference_database, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {', '.join(POSTGRES_TABLES)}")


def pytest_plugin_registered(plugin, plugin_name):
    # Their conftest's fixtures are read when its directory is collected, after this.
    if (
        plugin_name
        and plugin_name.endswith("conftest.py")
        and all(hasattr(plugin, name) for name in FIXTURES)
    ):
        plugin.sync_checkpointer = _Checkpointers.sync_checkpointer
        plugin.async_checkpointer = _Checkpointers.async_checkpointer
        _replaced.append(plugin_name)


# Their conftests whose fixtures were replaced: none, and their tests would run against
# their own savers, so the run stops instead.
_replaced: list[str] = []


def pytest_configure(config):
    if REFERENCE not in (None, *REFERENCES):
        raise pytest.UsageError(
            f"RESPAWN_UPSTREAM_REFERENCE={REFERENCE!r}: name one of {', '.join(REFERENCES)}"
        )
    config.stash[respawn_upstream.SUITE] = SUITE


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    if items and not _replaced:
        raise pytest.UsageError(
            f"no conftest of this langgraph defines {' and '.join(FIXTURES)}: "
            "tests/upstream/respawn_langgraph.py cannot put RespawnSaver in their place"
        )
    respawn_upstream.select(
        config,
        items,
        SUITE,
        lambda item: any(name in getattr(item, "fixturenames", ()) for name in FIXTURES),
    )
    for item in items:
        params = getattr(item, "callspec", None)
        saver = next((params.params[f] for f in FIXTURES if f in params.params), None)
        if saver is not None:
            # The test without the saver's parameter: the same test with each saver.
            name, _, ids = item.nodeid.partition("[")
            _savers[item.nodeid] = (saver, f"{name}[{ids.replace(saver, '', 1)}")


# A test's node id: its saver and the test without it; then the time each test with each
# saver took (its body, not the fixtures around it), when it passed.
_savers: dict[str, tuple[str, str]] = {}
_times: dict[str, dict[str, float]] = defaultdict(dict)


def pytest_runtest_logreport(report):
    if report.when == "call" and report.passed and report.nodeid in _savers:
        saver, test = _savers[report.nodeid]
        _times[test][saver] = report.duration


def pytest_terminal_summary(terminalreporter):
    respawn_upstream.summary(terminalreporter, SUITE)
    if REFERENCE is None:
        return
    both = [t for t in _times.values() if "respawn" in t and REFERENCE in t]
    slower = sorted(
        ((t["respawn"] - t[REFERENCE], name) for name, t in _times.items() if t in both),
        reverse=True,
    )
    for extra, name in slower[:10]:
        terminalreporter.write_line(f"respawn {extra * 1000:+.0f} ms: {name}")
    respawn = sum(t["respawn"] for t in both)
    reference = sum(t[REFERENCE] for t in both)
    terminalreporter.write_line(
        f"time in the {len(both)} tests that passed with both savers: respawn {respawn:.2f} s,"
        f" {REFERENCE} {reference:.2f} s (respawn/{REFERENCE} "
        f"{respawn / reference if reference else float('nan'):.2f}x)"
    )
