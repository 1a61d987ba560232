"""Servers a scaled-out deployment adds, started for the test that needs them."""

from __future__ import annotations

import re

import pytest
from django.conf import settings

from tests.conftest import ROOT
from tests.servers import PgBouncer

# Respawn's own code, where the scaled-out deployment's rules are checked line by line.
RESPAWN_PACKAGES = ("agent_runtime", "sessions_app", "config", "demo_agents")


def source_lines_matching(pattern: re.Pattern[str]) -> list[str]:
    """`path:number: line` for each line of Respawn's own code that matches, comments left
    out."""
    return [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for package in RESPAWN_PACKAGES
        for path in (ROOT / package).rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line) and not line.lstrip().startswith("#")
    ]


@pytest.fixture
def own_pgbouncer(request, pgbouncer):
    """A PgBouncer of the test's own in transaction mode, in front of the PostgreSQL
    server the tests use (behind the run's own PgBouncer, if any), with `pool_size`
    server connections per database (request.param, default 2)."""
    if pgbouncer is not None:
        host, port = pgbouncer.upstream
    else:
        db = settings.DATABASES["default"]
        host, port = db.get("HOST") or "127.0.0.1", db.get("PORT") or 5432
    bouncer = PgBouncer(host, port, pool_size=getattr(request, "param", 2))
    bouncer.start()
    yield bouncer
    bouncer.stop()
