"""session_store() is the store of the default database's dialect (the contract tests
run each dialect on its own database)."""

from __future__ import annotations

from django.db import connection

from sessions_app.store import DjangoSessionStore, session_store
from sessions_app.store.portable import PortableSessionStore
from sessions_app.store.postgresql import PostgreSQLSessionStore


def test_the_store_is_the_default_databases_dialect():
    store = session_store()
    expected = PostgreSQLSessionStore if connection.vendor == "postgresql" else PortableSessionStore
    assert type(store) is expected
    assert isinstance(store, DjangoSessionStore)
    # A dialect's class makes its own store, whatever the database.
    assert type(PortableSessionStore()) is PortableSessionStore
