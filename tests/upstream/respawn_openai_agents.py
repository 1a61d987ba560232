"""Our pytest plugin for the OpenAI Agents SDK's own tests (tests/upstream/run.py
openai-agents).

The SDK's session and runner tests take the SDK's reference store, `SQLiteSession`, by
name. This plugin puts `RespawnSQLiteSession` in its place in every test module (and helper)
of theirs: a RespawnSession on Respawn's test database with SQLiteSession's constructor, so
each test runs against Respawn's adapter unchanged. The tests that never make a
SQLiteSession (in their code or a fixture of their module) are deselected; the listed ones
that do not apply are skipped with their reason (tests/upstream/not_applicable.toml).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import respawn_upstream

SUITE = "openai-agents"
NAME = "SQLiteSession"

respawn_test_database = respawn_upstream.respawn_test_database
respawn_database = respawn_upstream.respawn_database

_made: list[Any] = []


@functools.cache
def stand_in() -> type:
    """RespawnSession with SQLiteSession's constructor. Session ids are kept apart per
    database file, and per instance for ":memory:", as SQLite keeps them."""
    from sessions_app.openai_agents import RespawnSession, session_id_for

    class RespawnSQLiteSession(RespawnSession):
        def __init__(
            self,
            session_id: str,
            db_path: str | Path = ":memory:",
            sessions_table: str = "agent_sessions",
            messages_table: str = "agent_messages",
            session_settings: Any = None,
        ) -> None:
            super().__init__(session_id, session_settings=session_settings)
            place = (
                os.urandom(8).hex() if str(db_path) == ":memory:" else str(Path(db_path).resolve())
            )
            self.respawn_id = session_id_for(f"{place}|{session_id}")
            self.db_path = db_path
            _made.append(self)

    return RespawnSQLiteSession


@pytest.fixture(autouse=True)
def respawn_sessions(respawn_database):
    """Each test on an emptied database; the sessions it made closed after it."""
    yield
    while _made:
        _made.pop().close()


def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _makes_session(item: pytest.Item) -> bool:
    """The test, or a fixture of its own module, makes a SQLiteSession (and the case is not
    the one of their fixtures that makes the SDK's AsyncSQLiteSession instead)."""
    function = getattr(item, "function", None)
    if function is None or "async-sqlite" in item.nodeid:
        return False
    sources = [_source(function)]
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info else ():
        for fixturedef in defs:
            if getattr(fixturedef.func, "__module__", None) == function.__module__:
                sources.append(_source(fixturedef.func))
    return any(NAME in source for source in sources)


def pytest_configure(config):
    config.stash[respawn_upstream.SUITE] = SUITE


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    respawn_upstream.select(config, items, SUITE, _makes_session)


def pytest_collection_finish(session):
    from agents import SQLiteSession

    replacement = stand_in()
    tests = session.config.rootpath / "tests"
    replaced = 0
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if (
            path
            and Path(path).is_relative_to(tests)
            and getattr(module, NAME, None) is SQLiteSession
        ):
            setattr(module, NAME, replacement)
            replaced += 1
    if session.items and not replaced:
        # Their tests would run against SQLiteSession itself.
        raise pytest.UsageError(
            f"no test module of this openai-agents imports {NAME} by name: "
            "tests/upstream/respawn_openai_agents.py cannot put RespawnSession in its place"
        )


def pytest_terminal_summary(terminalreporter):
    respawn_upstream.summary(terminalreporter, SUITE)
