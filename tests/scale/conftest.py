"""Servers a scaled-out deployment adds, started for the test that needs them."""

from __future__ import annotations

import pytest
from django.conf import settings

from tests.servers import PgBouncer


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
