"""Our pytest plugin for LangGraph's own tests (tests/upstream/run.py langgraph).

LangGraph's tests take a checkpointer from two fixtures of their conftest,
`sync_checkpointer` and `async_checkpointer`, parametrised over the savers they ship. This
plugin puts ours in their place, parametrised over "respawn" (RespawnSaver and
AsyncRespawnSaver on Respawn's test database, emptied after each test) and, with
RESPAWN_UPSTREAM_REFERENCE=1, "memory" (their in-memory reference saver). The tests that
take neither fixture are deselected; the listed ones that do not apply are skipped with
their reason (tests/upstream/not_applicable.toml).
"""

from __future__ import annotations

import asyncio

import pytest
import respawn_upstream

SUITE = "langgraph"
FIXTURES = ("sync_checkpointer", "async_checkpointer")
PARAMS = ["respawn", "memory"] if respawn_upstream.reference_too() else ["respawn"]


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
        from sessions_app.langgraph import AsyncRespawnSaver

        saver = AsyncRespawnSaver()
        try:
            yield saver
        finally:
            await asyncio.to_thread(saver.close)


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


def pytest_terminal_summary(terminalreporter):
    respawn_upstream.summary(terminalreporter, SUITE)
