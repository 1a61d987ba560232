"""Settings for the test suite: real PostgreSQL and Redis on loopback by default, short
leases and a fast reconciler so fault tests finish in seconds. Worker processes started by
the tests use these settings too, with the same environment."""

import os
from urllib.parse import urlsplit, urlunsplit

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/respawn")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")
# Run in parallel (pytest -n N), each test process has a Redis database of its own, counted
# down from the one given (some tests flush theirs); pytest-django gives each its own test
# database (test_respawn_gw0, ...), and the worker processes a test starts use both.
# Once: the processes the tests start inherit the environment, already adjusted.
_parallel = os.environ.get("PYTEST_XDIST_WORKER")
if _parallel and os.environ.get("RESPAWN_TEST_PROCESS") != _parallel:
    _redis = urlsplit(os.environ["REDIS_URL"])
    _base = int(_redis.path.strip("/") or 0)
    _index = int(_parallel.removeprefix("gw"))
    if _index > _base:
        raise RuntimeError(f"too many test processes for Redis database {_base} (REDIS_URL)")
    os.environ["REDIS_URL"] = urlunsplit(_redis._replace(path=f"/{_base - _index}"))
    os.environ["RESPAWN_TEST_PROCESS"] = _parallel
# One queue per test run, so a developer's own worker never takes the tests' jobs.
os.environ.setdefault("RESPAWN_QUEUE", f"respawn-test-{os.getpid()}")
os.environ.setdefault("RESPAWN_LEASE_TTL", "2")
os.environ.setdefault("RESPAWN_RECONCILE_INTERVAL", "0.5")
os.environ.setdefault("RESPAWN_DISPATCH_GRACE", "2")
os.environ.setdefault("RESPAWN_SLOW_DELAY", "0.2")
os.environ.setdefault("RESPAWN_MODEL_BACKOFF", "0.01")
os.environ.setdefault("RESPAWN_PRODUCTION", "0")
# Alerts: a receiver "down for a minute" is a few seconds here (docs/RELIABILITY.md).
os.environ.setdefault("RESPAWN_ALERT_INTERVAL", "0.2")
os.environ.setdefault("RESPAWN_ALERT_SWEEP_INTERVAL", "1")
os.environ.setdefault("RESPAWN_ALERT_TIMEOUT", "1")
os.environ.setdefault("RESPAWN_ALERT_BACKOFF", "0.2")
os.environ.setdefault("RESPAWN_ALERT_BACKOFF_MAX", "1")
os.environ.setdefault("RESPAWN_ALERT_RULES_CACHE", "0")
os.environ.setdefault("RESPAWN_ALERT_STUCK_AFTER", "3")
# Only the agents a test names: a package with a respawn.agents entry point that a developer
# installed into the virtualenv must not change what the tests see. The entry-point tests
# switch it on for themselves.
os.environ.setdefault("RESPAWN_AGENT_ENTRY_POINTS", "0")
# No connection pool in the test process itself: the test runner renames the database to
# its test copy after a pool may already hold connections to the original. The pooled web
# configuration is tested in a real server process (tests/integration/test_web_process.py).
os.environ.setdefault("RESPAWN_DB_POOL", "0")

from .settings import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
