"""What both of our plugins for the frameworks' own tests share (tests/upstream/run.py runs
them): the list of tests that do not apply, the selection of the tests that exercise the
adapter, and the count printed at the end of a run."""

from __future__ import annotations

import importlib.metadata
import os
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

LIST = Path(__file__).resolve().parent / "not_applicable.toml"
SKIP_PREFIX = "not applicable to Respawn's PostgreSQL-backed adapter: "


# The suite a run is of (its plugin says, in pytest_configure).
SUITE = pytest.StashKey[str]()


class ListError(pytest.UsageError):
    pass


def not_applicable(suite: str) -> dict[str, str]:
    """The suite's tests that do not apply: node id (with or without its parameters) to
    reason."""
    with LIST.open("rb") as f:
        entries = tomllib.load(f).get(suite, {})
    for node, reason in entries.items():
        if not isinstance(reason, str) or not reason.strip():
            raise ListError(f"{LIST.name} [{suite}] {node}: every entry needs its reason")
    return entries


def select(
    config: pytest.Config,
    items: list[pytest.Item],
    suite: str,
    exercises_adapter: Callable[[pytest.Item], bool],
) -> None:
    """Keep the tests that exercise the adapter (deselect the others) and mark the listed
    ones skipped with their reason. An entry that names no collected test of a collected
    file is an error: the list stays true as the suite changes."""
    listed = not_applicable(suite)
    seen: set[str] = set()
    files = {item.nodeid.split("::")[0] for item in items}
    kept, dropped = [], []
    for item in items:
        key = next((k for k in (item.nodeid, item.nodeid.split("[")[0]) if k in listed), None)
        if key is not None:
            seen.add(key)
        if not exercises_adapter(item):
            dropped.append(item)
            continue
        if key is not None:
            item.add_marker(pytest.mark.skip(reason=SKIP_PREFIX + listed[key]))
        kept.append(item)
    stale = [n for n in listed if n not in seen and n.split("::")[0] in files]
    if stale:
        raise ListError(
            f"{LIST.name} [{suite}] names tests that are not in this version of the suite "
            f"(remove them): {', '.join(sorted(stale))}"
        )
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def summary(terminalreporter, suite: str) -> None:
    stats = terminalreporter.stats
    passed = len(stats.get("passed", []))
    failed = len(stats.get("failed", [])) + len(stats.get("error", []))
    skipped = stats.get("skipped", [])
    listed = sum(
        1
        for report in skipped
        if isinstance(report.longrepr, tuple) and SKIP_PREFIX in str(report.longrepr[2])
    )
    version = importlib.metadata.version(suite)
    terminalreporter.write_sep(
        "=",
        f"Respawn on {suite} {version}'s own tests: {passed} passed, {failed} failed, "
        f"{listed} not applicable ({LIST.relative_to(LIST.parents[2])}), "
        f"{len(skipped) - listed} skipped by the suite itself",
        bold=True,
        red=bool(failed),
        green=not failed,
    )


@pytest.fixture(scope="session")
def respawn_test_database(request, django_test_environment, django_db_blocker):
    """Respawn's test database, created (migrated) for the run and dropped after it, as
    pytest-django does for tests that ask for a database (their tests do not ask). Each
    process has its own, named after it (RESPAWN_UPSTREAM_RUN, else the suite): the suites
    run side by side."""
    from django.db import connections
    from django.test.utils import setup_databases, teardown_databases

    database = connections["default"].settings_dict
    test = database.setdefault("TEST", {})
    name = test.get("NAME") or f"test_{database['NAME']}"
    run = os.environ.get("RESPAWN_UPSTREAM_RUN") or request.config.stash[SUITE]
    test["NAME"] = f"{name}_{run.replace('-', '_')}"
    with django_db_blocker.unblock():
        databases = setup_databases(verbosity=0, interactive=False, aliases={"default"})
    yield
    with django_db_blocker.unblock():
        teardown_databases(databases, verbosity=0)


@pytest.fixture
def respawn_database(respawn_test_database, django_db_blocker):
    """Respawn's test database, emptied of every row the adapters wrote after each test:
    their tests reuse thread and session ids."""
    with django_db_blocker.unblock():
        yield
        _empty_respawn_tables()


def _empty_respawn_tables() -> None:
    # DELETE, in one transaction: Django's foreign keys on PostgreSQL are checked at
    # commit, and a few rows delete far faster than TRUNCATE recreates every table. The
    # audit log refuses DELETE (append-only): it is truncated, when it has rows.
    from django.apps import apps
    from django.db import connection, transaction

    audit = apps.get_model("sessions_app", "AuditEvent")._meta.db_table
    tables = sorted(
        model._meta.db_table
        for model in apps.get_app_config("sessions_app").get_models(include_auto_created=True)
        if model._meta.managed and not model._meta.proxy and model._meta.db_table != audit
    )
    quote = connection.ops.quote_name
    with transaction.atomic(), connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"DELETE FROM {quote(table)}")
        cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {quote(audit)})")
        if cursor.fetchone()[0]:
            cursor.execute(f"TRUNCATE {quote(audit)}")


def reference() -> str | None:
    """RESPAWN_UPSTREAM_REFERENCE: also run the tests with one of the framework's own
    stores, the reference the adapter is compared with ("1" names the in-memory one)."""
    value = os.environ.get("RESPAWN_UPSTREAM_REFERENCE", "")
    return None if value in ("", "0") else "memory" if value == "1" else value
