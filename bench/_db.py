"""Benchmark databases: each bench gets a fresh PostgreSQL database of its own.

A migrated database is a copy of a template migrated once (`respawn_bench_migrated_<key>`,
the key a digest of the migrations and Django's version): migrating takes seconds, a copy a
tenth of one, and the tests run every bench.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import psycopg

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SERVER = "postgres://postgres@127.0.0.1:5432/postgres"
BENCH_PREFIX = "respawn_bench"


def server_url() -> str:
    return os.environ.get("BENCH_DATABASE_URL") or os.environ.get("DATABASE_URL") or DEFAULT_SERVER


def with_db(url: str, name: str) -> str:
    parts = urlparse(url)
    return urlunparse(parts._replace(path=f"/{name}"))


def database_name(name: str) -> str:
    """`name`, its respawn_bench prefix replaced by RESPAWN_BENCH_DB_PREFIX when set: two
    checkouts benchmarking on one server each keep databases of their own."""
    prefix = os.environ.get("RESPAWN_BENCH_DB_PREFIX")
    if prefix and name.startswith(BENCH_PREFIX):
        return prefix + name[len(BENCH_PREFIX) :]
    return name


def database_url(name: str) -> str:
    """The URL of bench database `name` (see database_name) on the server."""
    return with_db(server_url(), database_name(name))


def migrate_database(url: str) -> None:
    """Run Django's migrations on the database at `url`, in a child process."""
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "RESPAWN_PRODUCTION": "0",  # a benchmark, not a deployment: no SECRET_KEY needed
    }
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True
    )


def drop_database(name: str) -> None:
    """Drop bench database `name` (see database_name), connections to it included."""
    with psycopg.connect(with_db(server_url(), "postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database_name(name)}" WITH (FORCE)')


def fresh_database(name: str, *, migrate: bool = True, template: str | None = None) -> str:
    """Drop and create database `name` (see database_name) on the server, migrated unless
    `migrate` is false, or a copy of bench database `template` (nobody may be connected
    to it); returns its URL."""
    if template is None and migrate:
        template = migrated_template()
    drop_database(name)
    copy = f' TEMPLATE "{database_name(template)}"' if template else ""
    with psycopg.connect(with_db(server_url(), "postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database_name(name)}"{copy}')
    return database_url(name)


def migrated_template() -> str:
    """The bench database migrated to the checkout's migrations, made on first use. Its name
    changes with the migrations, so a stale one is never copied."""
    from importlib.metadata import version

    digest = hashlib.sha256(version("django").encode())
    for path in sorted((ROOT / "sessions_app" / "migrations").glob("*.py")):
        digest.update(path.name.encode() + path.read_bytes())
    name = f"{BENCH_PREFIX}_migrated_{digest.hexdigest()[:12]}"
    final, building = database_name(name), database_name(f"{name}_building")
    with psycopg.connect(with_db(server_url(), "postgres"), autocommit=True) as conn:
        # Two benches starting at once: one migrates, the other waits and copies.
        conn.execute("SELECT pg_advisory_lock(hashtext(%s))", [final])
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [final]).fetchone()
        if not exists:
            # Migrated under another name and renamed once done: an interrupted migration
            # never leaves a half-migrated template behind.
            conn.execute(f'DROP DATABASE IF EXISTS "{building}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{building}"')
            migrate_database(with_db(server_url(), building))
            conn.execute(f'ALTER DATABASE "{building}" RENAME TO "{final}"')
        conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", [final])
    return name


def setup_django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("RESPAWN_DB_POOL", "0")
    os.environ.setdefault("RESPAWN_PRODUCTION", "0")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
