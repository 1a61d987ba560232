"""The web processes' database backend (config.postgresql): a request gets a connection
of its own while the pool has none to give, at most the pool's size of them at a time."""

from __future__ import annotations

import pytest
from psycopg_pool import ConnectionPool, PoolTimeout

from config.postgresql.base import CheckedPool

from ..conftest import database_url

pytestmark = pytest.mark.django_db(transaction=True)


def test_connections_of_a_requests_own_are_bounded_by_the_pool_size():
    pool = ConnectionPool(
        database_url(), min_size=1, max_size=1, timeout=1.0, kwargs={"autocommit": True}, open=True
    )
    checked = CheckedPool(pool, configure=lambda conn: None)
    try:
        pooled = checked.getconn()
        assert pooled._pool is pool
        own = checked.getconn()  # the pool has none to give: one of its own
        assert getattr(own, "_pool", None) is None
        assert own.execute("SELECT 1").fetchone() == (1,)
        with pytest.raises(PoolTimeout):  # as many of its own as the pool's size
            checked.getconn()
        own.close()
        CheckedPool.release_own()
        again = checked.getconn()
        assert getattr(again, "_pool", None) is None
        again.close()
        CheckedPool.release_own()
        pool.putconn(pooled)
    finally:
        pool.close()
