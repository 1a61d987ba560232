"""Benchmark databases: each bench gets a fresh PostgreSQL database of its own."""

from __future__ import annotations

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


def fresh_database(name: str, *, migrate: bool = True) -> str:
    """Drop and create database `name` (see database_name) on the server, migrate it;
    returns its URL."""
    drop_database(name)
    with psycopg.connect(with_db(server_url(), "postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database_name(name)}"')
    url = database_url(name)
    if migrate:
        migrate_database(url)
    return url


def setup_django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("RESPAWN_DB_POOL", "0")
    os.environ.setdefault("RESPAWN_PRODUCTION", "0")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
