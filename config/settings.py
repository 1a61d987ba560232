"""Respawn settings. Everything that differs between machines comes from the environment."""

from __future__ import annotations

import ipaddress
import json
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from config.database_url import DatabaseUrlError, parse_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("RESPAWN_VAR_DIR", BASE_DIR / "var"))


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return float(value)
    except ValueError:
        raise SystemExit(f"{name} must be a number, got {value!r}") from None


def env_secret(name: str) -> str:
    """A secret from the environment: NAME itself, or the contents of the file that
    NAME_FILE names (a mounted secret, e.g. /run/secrets/openai_api_key)."""
    path = os.environ.get(f"{name}_FILE")
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise SystemExit(f"{name}_FILE={path!r} cannot be read: {exc}") from None
    return os.environ.get(name, "")


def env_database(name: str) -> dict[str, Any]:
    """Django's DATABASES entry for the URL in the environment variable `name`
    (config.database_url: libpq's multi-host form included)."""
    try:
        return parse_database_url(os.environ[name], name=name)
    except DatabaseUrlError as exc:
        raise SystemExit(str(exc)) from None


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if not value:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


DEBUG = env_bool("DEBUG", False)
DATABASE_URL = os.environ.get("DATABASE_URL", "")
# Production unless DEBUG is on or the database is the local SQLite file of `make run`: a
# deployment (DATABASE_URL set, DEBUG off) gets secure cookies, HSTS, HTTPS redirects and a
# refusal to start without a real SECRET_KEY. RESPAWN_PRODUCTION=0/1 says it explicitly.
PRODUCTION = env_bool("RESPAWN_PRODUCTION", not DEBUG and bool(DATABASE_URL))
DEVELOPMENT_SECRET_KEY = "respawn-insecure-development-key-change-me"
SECRET_KEY = os.environ.get("SECRET_KEY", "")
if PRODUCTION and (len(SECRET_KEY) < 50 or SECRET_KEY == DEVELOPMENT_SECRET_KEY):
    raise SystemExit(
        "SECRET_KEY must be set to a long random value in production (50+ characters), e.g. "
        "python -c 'import secrets; print(secrets.token_urlsafe(64))'. "
        "For local development set DEBUG=1 or RESPAWN_PRODUCTION=0."
    )
SECRET_KEY = SECRET_KEY or DEVELOPMENT_SECRET_KEY

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# --- Transport security -----------------------------------------------------------------
# Behind a TLS-terminating proxy, set RESPAWN_PROXY_SSL_HEADER=1 (it must overwrite
# X-Forwarded-Proto from clients); Django then trusts that header for request.is_secure().
if env_bool("RESPAWN_PROXY_SSL_HEADER", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = env_bool("RESPAWN_SSL_REDIRECT", PRODUCTION)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = PRODUCTION
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = True  # htmx reads the token from hx-headers, never from the cookie
# A refused form says so in the dashboard's style (Django's own page needs inline styles).
CSRF_FAILURE_VIEW = "sessions_app.dashboard.views.csrf_failure"
SESSION_COOKIE_SAMESITE = CSRF_COOKIE_SAMESITE = "Lax"
SECURE_HSTS_SECONDS = int(env_float("RESPAWN_HSTS_SECONDS", 31536000 if PRODUCTION else 0))
SECURE_HSTS_INCLUDE_SUBDOMAINS = PRODUCTION
SECURE_HSTS_PRELOAD = PRODUCTION
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# Content-Security-Policy on every response (sessions_app.web.middleware): no inline or
# eval'd script anywhere, no framing.
RESPAWN_CSP = os.environ.get(
    "RESPAWN_CSP",
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'",
)

INSTALLED_APPS = [
    # django.contrib.admin, with Respawn's roles on its site (sessions_app/admin/site.py)
    "sessions_app.apps.RespawnAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "django_rq",
    "template_partials",
    "ninja",
    "sessions_app",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # A database that is down or out of connections: a quick 503 (JSON for the API).
    "sessions_app.web.middleware.DatabaseUnavailableMiddleware",
    "sessions_app.web.middleware.ContentSecurityPolicyMiddleware",
    # Read-only pages from the read replica, when DATABASE_REPLICA_URL configures one.
    "sessions_app.web.replicas.ReplicaReadsMiddleware",
    # A lock held by another transaction delays a request at most RESPAWN_LOCK_WAIT (503).
    "sessions_app.web.middleware.LockWaitMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    # No control character in any query or form parameter reaches a view (a clear 400).
    "sessions_app.validation.InputGuardMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------
# PostgreSQL in production and in the tests; a SQLite file when DATABASE_URL is unset
# (the `make run` default on a fresh machine). DATABASE_URL may list several hosts, as
# libpq does (postgres://user@10.0.0.5:5432,10.0.0.6:5432/respawn): each connection goes to
# the one that is the primary now (target_session_attrs=read-write unless the URL says
# otherwise), so after a failover reconnecting finds the promoted server (docs/DEPLOY.md).
_IS_WORKER = len(sys.argv) > 1 and sys.argv[1] == "rqworker"
if DATABASE_URL:
    _db = env_database("DATABASE_URL")
else:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    _db = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(VAR_DIR / "respawn.sqlite3")}

# RESPAWN_POOLER_SAFE=1: DATABASE_URL names a pooler in transaction mode (PgBouncer), not
# PostgreSQL itself; no session state is kept on a server connection between transactions.
RESPAWN_POOLER_SAFE = env_bool("RESPAWN_POOLER_SAFE", False)
if _db["ENGINE"] == "django.db.backends.postgresql":
    # Django's native psycopg pool in web processes. A worker process runs one job at a
    # time and keeps one plain persistent connection from job to job instead, checked
    # before the first query of each job (the server may have dropped it while idle).
    #
    # While the database is down, a request waits at most RESPAWN_DB_WAIT seconds for a
    # connection (then answers 503, see sessions_app.web.middleware), and a connection attempt
    # to a host that does not answer gives up after as long.
    _db_wait = env_float("RESPAWN_DB_WAIT", 3.0)
    _db.setdefault("OPTIONS", {}).setdefault("connect_timeout", max(1, round(_db_wait)))
    # The pool retries a failed connection with a growing pause (1 s, 2 s, 4 s, ...); it
    # gives up after RESPAWN_DB_WAIT and the next request starts afresh, so once the
    # database is back the first request is served instead of waiting out a pause.
    RESPAWN_DB_POOL_OPTIONS = {
        "min_size": 1,
        "max_size": 10,
        "timeout": _db_wait,
        "reconnect_timeout": _db_wait,
    }
    _pooled = env_bool("RESPAWN_DB_POOL", True) and not _IS_WORKER
    if _pooled:
        _db["OPTIONS"]["pool"] = dict(RESPAWN_DB_POOL_OPTIONS)
        # Django's backend, but each connection is checked as it leaves the pool (an empty
        # query) by the request itself, so that one a restart of PostgreSQL or PgBouncer
        # broke is replaced at once (the pool's own check paused 1 s, 2 s, ... between
        # two broken ones), and a request served as soon as the server is back even while
        # the pool waits out a pause between its reconnection attempts (config/postgresql).
        _db["ENGINE"] = "config.postgresql"
    else:
        _db["CONN_MAX_AGE"] = None
    # Persistent: checked before the first query of each job or request. Pooled: checked
    # by config.postgresql instead of the pool.
    _db["CONN_HEALTH_CHECKS"] = not _pooled
    _db.setdefault("TEST", {})["NAME"] = os.environ.get("RESPAWN_TEST_DB_NAME") or None
    if RESPAWN_POOLER_SAFE:
        # Behind a pooler in transaction mode (PgBouncer's pool_mode=transaction) each
        # transaction may run on another server connection: nothing may outlive one. No
        # server-side prepared statements (psycopg's prepare_threshold None; the store's
        # explicit ones are off too, sessions_app.store) and no cursors held open across
        # transactions (Django's .iterator() declares them WITH HOLD outside a transaction).
        _db.setdefault("OPTIONS", {})["prepare_threshold"] = None
        _db["DISABLE_SERVER_SIDE_CURSORS"] = True
elif _db["ENGINE"] == "django.db.backends.sqlite3":
    # Web server and worker write the same file: WAL lets readers go on during a write,
    # IMMEDIATE transactions take the write lock up front instead of failing on upgrade.
    _db.setdefault("OPTIONS", {}).update(
        {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
DATABASES = {"default": _db}

# A read replica (a streaming replica of the primary) for the dashboard's and the API's
# read-only pages (sessions_app.web.replicas): everything else, and every page that must see
# its own writes, reads the primary.
DATABASE_REPLICA_URL = os.environ.get("DATABASE_REPLICA_URL", "")
if DATABASE_REPLICA_URL:
    _replica = env_database("DATABASE_REPLICA_URL")
    if "postgresql" not in _db["ENGINE"] or _replica["ENGINE"] != "django.db.backends.postgresql":
        raise SystemExit(
            "DATABASE_REPLICA_URL needs PostgreSQL: both DATABASE_URL and DATABASE_REPLICA_URL "
            "must be postgres:// URLs (the replica streaming from the primary)"
        )
    for _key in ("ENGINE", "CONN_MAX_AGE", "CONN_HEALTH_CHECKS", "DISABLE_SERVER_SIDE_CURSORS"):
        if _key in _db:
            _replica[_key] = _db[_key]
    _replica["OPTIONS"] = {**_db.get("OPTIONS", {}), **_replica.get("OPTIONS", {})}
    # The tests' replica is the test database itself.
    _replica["TEST"] = {"MIRROR": "default"}
    DATABASES["replica"] = _replica
    DATABASE_ROUTERS = ["sessions_app.web.replicas.ReplicaRouter"]
# Seconds after a write during which the client that wrote reads only from the primary.
RESPAWN_REPLICA_STICKY = env_float("RESPAWN_REPLICA_STICKY", 10.0)
# A replica further behind than this many seconds is not read from (the primary is).
RESPAWN_REPLICA_MAX_LAG = env_float("RESPAWN_REPLICA_MAX_LAG", 30.0)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis and RQ -----------------------------------------------------------------------
# With no REDIS_URL, use the embedded server `make run` started (it leaves its URL in
# var/redis.url while it runs), so commands from another shell reach the same Redis.
_EMBEDDED_REDIS = VAR_DIR / "redis.url"
REDIS_URL = os.environ.get("REDIS_URL") or (
    _EMBEDDED_REDIS.read_text().strip() if _EMBEDDED_REDIS.exists() else "redis://127.0.0.1:6379/0"
)


def redis_sentinels(value: str) -> list[tuple[str, int]]:
    """REDIS_SENTINELS: comma-separated host:port pairs of the Sentinels to ask."""
    sentinels = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise SystemExit(
                f"REDIS_SENTINELS: {item!r} is not host:port "
                "(e.g. REDIS_SENTINELS=10.0.0.5:26379,10.0.0.6:26379,10.0.0.7:26379)"
            )
        sentinels.append((host.strip("[]"), int(port)))
    return sentinels


# Redis through Sentinel (a highly available Redis): the Sentinels to ask and the name of
# the master they monitor; REDIS_URL is then not used. Every connection to Redis, in every
# process, is made from RQ_QUEUES below by django-rq
# (sessions_app.services.dispatch.redis_connection): after a failover, new connections go to
# the new master.
REDIS_SENTINELS = redis_sentinels(os.environ.get("REDIS_SENTINELS", ""))
REDIS_SENTINEL_MASTER = os.environ.get("REDIS_SENTINEL_MASTER", "").strip()
REDIS_PASSWORD = env_secret("REDIS_PASSWORD")
REDIS_SENTINEL_PASSWORD = env_secret("REDIS_SENTINEL_PASSWORD")
if REDIS_SENTINELS:
    if not REDIS_SENTINEL_MASTER:
        raise SystemExit(
            "REDIS_SENTINELS is set but REDIS_SENTINEL_MASTER is not: set it to the name the "
            "Sentinels monitor the master under (their `sentinel monitor <name> ...` line)"
        )
    REDIS_CONNECTION = {
        "SENTINELS": REDIS_SENTINELS,
        "MASTER_NAME": REDIS_SENTINEL_MASTER,
        "DB": int(env_float("REDIS_DB", 0)),
        "PASSWORD": REDIS_PASSWORD or None,
        # Asking a Sentinel that is down must not hang a request: the next one is asked.
        "SENTINEL_KWARGS": {
            "password": REDIS_SENTINEL_PASSWORD or None,
            "socket_timeout": 1.0,
            "socket_connect_timeout": 1.0,
        },
    }
else:
    REDIS_CONNECTION = {"URL": REDIS_URL}
# Session runs go to this queue; `manage.py rqworker` with no argument serves "default".
RESPAWN_QUEUE = os.environ.get("RESPAWN_QUEUE", "default")
RQ_QUEUES = {
    name: {**REDIS_CONNECTION, "DEFAULT_TIMEOUT": 3600} for name in {"default", RESPAWN_QUEUE}
}
# The worker class runs jobs in a long-lived process under a supervisor that restarts it
# when it dies, and the reconciler on a timer beside the job loop (sessions_app/workers/worker.py).
RQ = {"WORKER_CLASS": "sessions_app.workers.worker.RespawnWorker"}
RESPAWN_WORKER_SUPERVISE = env_bool("RESPAWN_WORKER_SUPERVISE", True)
# The queue dashboard is mounted once, under /admin/rq/, behind Respawn's roles
# (sessions_app/admin/queues.py); the admin index links to it.
RQ_SHOW_ADMIN_LINK = False

# --- Respawn runtime --------------------------------------------------------------------
# Seconds a worker's lease on a session lasts without a heartbeat. A crashed worker's
# session is taken over by another worker after at most this long.
RESPAWN_LEASE_TTL = env_float("RESPAWN_LEASE_TTL", 10.0)
# How often each worker process runs the reconciler (finds runnable sessions with no
# live lease and dispatches them again), independent of what Redis still holds. It also
# runs just after the next live lease expires, so a dead worker's session is taken over
# about RESPAWN_LEASE_TTL after its last heartbeat, not up to this much later.
RESPAWN_RECONCILE_INTERVAL = env_float("RESPAWN_RECONCILE_INTERVAL", 15.0)
# A queued session whose job a worker took but has not run after this many seconds is
# dispatched again (one whose job is gone from Redis, or failed, on the reconciler's next pass).
RESPAWN_DISPATCH_GRACE = env_float("RESPAWN_DISPATCH_GRACE", 30.0)
RESPAWN_MODEL_RETRIES = int(env_float("RESPAWN_MODEL_RETRIES", 3))
# A tool call that fails on the infrastructure (the database, Redis or the network
# unavailable, out of connections, timing out) is tried again with backoff for this many
# seconds before its error is recorded (idempotent tools only).
RESPAWN_TRANSIENT_RETRY_FOR = env_float("RESPAWN_TRANSIENT_RETRY_FOR", 60.0)
RESPAWN_MODEL_BACKOFF = env_float("RESPAWN_MODEL_BACKOFF", 0.5)
# The agents this deployment runs: `module:attribute` paths, comma-separated, each naming
# an Agent, a list of agents or a function returning them (agent_runtime.discovery).
# Installed packages add theirs through the `respawn.agents` entry-point group. The demo
# agents (their own knobs: RESPAWN_SLOW_DELAY, RESPAWN_BATCH_DELAY,
# RESPAWN_RESEARCH_DELAY, RESPAWN_RESEARCH_PARALLEL, read by demo_agents) are the default
# and are not loaded when RESPAWN_AGENTS is set without them.
RESPAWN_AGENTS = [
    path.strip()
    for path in os.environ.get("RESPAWN_AGENTS", "demo_agents:agents").split(",")
    if path.strip()
]
RESPAWN_AGENT_ENTRY_POINTS = env_bool("RESPAWN_AGENT_ENTRY_POINTS", True)


def _retention_policy() -> tuple[object, str]:
    """RESPAWN_RETENTION (JSON) or the JSON file RESPAWN_RETENTION_FILE names, and what is
    wrong with reading it; the policy itself is checked by a system check
    (sessions_app.checks) and applied by `manage.py apply_retention`."""
    raw = os.environ.get("RESPAWN_RETENTION", "")
    path = os.environ.get("RESPAWN_RETENTION_FILE", "")
    if path:
        try:
            raw = Path(path).read_text()
        except OSError as exc:
            return {}, f"RESPAWN_RETENTION_FILE={path}: {exc.strerror}"
    if not raw.strip():
        return {}, ""
    try:
        return json.loads(raw), ""
    except ValueError as exc:
        return {}, f"the retention policy is not JSON: {exc}"


# Retention policies (sessions_app/upkeep/retention.py; the README's "Retention"): off by default.
RESPAWN_RETENTION, RESPAWN_RETENTION_PROBLEM = _retention_policy()
# A session whose worker dies this many times in a row at the same step is failed (a
# poison session) instead of taking workers down forever.
RESPAWN_MAX_CRASHES = int(env_float("RESPAWN_MAX_CRASHES", 5))
# Approvals waiting longer than this many seconds are listed under "needs attention".
RESPAWN_APPROVAL_SLA = env_float("RESPAWN_APPROVAL_SLA", 3600)


def _json_setting(name: str) -> object:
    """An environment variable holding JSON, parsed; the text itself when it is not JSON
    (the system check that reads the setting names the problem), {} when unset."""
    raw = os.environ.get(name, "")
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        return raw


# How long each kind of "needs attention" item may wait before it is past its target,
# in seconds, by section (stuck, uncertain, approvals, incompatible, budget, failed,
# failed_calls, late_calls), as JSON: {"stuck": 600, "approvals": 7200}. A section not
# named keeps its default (sessions_app.selectors.ATTENTION_TARGETS); checked at start
# (sessions_app.checks).
RESPAWN_ATTENTION_TARGETS = _json_setting("RESPAWN_ATTENTION_TARGETS")
# Teams declared in settings, as JSON: {"support": {"name": "Support", "agents":
# ["support-bot"], "members": {"alice": "operator"}}} (slug: name, the agents the team owns
# and its members' roles: viewer, operator or team_admin). `manage.py sync_teams` writes
# them into the tables the admin edits (sessions_app.services.teams); {} declares none.
RESPAWN_TEAMS = _json_setting("RESPAWN_TEAMS")
# The reconciler dispatches at most this many sessions per pass: bulk resumes of
# thousands reach the workers (and the model provider) in waves, not all at once.
RESPAWN_RECONCILE_BATCH = int(env_float("RESPAWN_RECONCILE_BATCH", 200))
# How often each worker indexes new steps for the dashboard's search (PostgreSQL; one
# worker at a time does it, off the append path): a step is searchable about this many
# seconds after it is written. 0: off (run `manage.py index_search` instead).
RESPAWN_SEARCH_INTERVAL = env_float("RESPAWN_SEARCH_INTERVAL", 2.0)
# --- Alerts (sessions_app/upkeep/alerts.py; docs/RELIABILITY.md, "Alerts") -------------
# Each worker process sends due alert deliveries from a thread of its own, looking this
# often (seconds); 0: off (run `manage.py send_alerts` instead).
RESPAWN_ALERT_INTERVAL = env_float("RESPAWN_ALERT_INTERVAL", 1.0)
# How often the alert sweep raises alerts of time-based states (stuck) and of states that
# no append wrote, and resolves alerts whose session left its state.
RESPAWN_ALERT_SWEEP_INTERVAL = env_float("RESPAWN_ALERT_SWEEP_INTERVAL", 10.0)
# A receiver's connect and read timeout: a receiver that hangs holds one sending thread
# this long at most, never a session.
RESPAWN_ALERT_TIMEOUT = env_float("RESPAWN_ALERT_TIMEOUT", 5.0)
# Retries: after the n-th failed attempt, wait BACKOFF * 2**(n-1) seconds (jittered),
# at most BACKOFF_MAX; after MAX_ATTEMPTS attempts the delivery "gave up".
RESPAWN_ALERT_BACKOFF = env_float("RESPAWN_ALERT_BACKOFF", 2.0)
RESPAWN_ALERT_BACKOFF_MAX = env_float("RESPAWN_ALERT_BACKOFF_MAX", 300.0)
RESPAWN_ALERT_MAX_ATTEMPTS = int(env_float("RESPAWN_ALERT_MAX_ATTEMPTS", 15))
# Deliveries one worker process sends at once.
RESPAWN_ALERT_CONCURRENCY = int(env_float("RESPAWN_ALERT_CONCURRENCY", 4))
# How long a process trusts its "is there any enabled rule?" answer (seconds).
RESPAWN_ALERT_RULES_CACHE = env_float("RESPAWN_ALERT_RULES_CACHE", 5.0)
# A session stuck (should be running, no live lease) this many seconds raises "stuck".
RESPAWN_ALERT_STUCK_AFTER = env_float("RESPAWN_ALERT_STUCK_AFTER", 120.0)
# The dashboard's address as receivers should link to it.
RESPAWN_PUBLIC_URL = os.environ.get("RESPAWN_PUBLIC_URL", "http://localhost:8000").rstrip("/")
# E-mail alerts go through Django's mail settings.
EMAIL_HOST = os.environ.get("EMAIL_HOST", "localhost")
EMAIL_PORT = int(env_float("EMAIL_PORT", 25))
EMAIL_HOST_USER = os.environ.get("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_secret("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)
EMAIL_TIMEOUT = env_float("EMAIL_TIMEOUT", 10.0)
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "respawn@localhost")
RESPAWN_MODEL = os.environ.get("RESPAWN_MODEL", "")
OPENAI_BASE_URL = os.environ.get("OPENAI_BASE_URL", "")
OPENAI_API_KEY = env_secret("OPENAI_API_KEY")
ANTHROPIC_BASE_URL = os.environ.get("ANTHROPIC_BASE_URL", "")
ANTHROPIC_API_KEY = env_secret("ANTHROPIC_API_KEY")
# Extra redaction patterns (regular expressions, one per line): matches are replaced with a
# marker before any step or checkpoint is stored, on top of the built-in key patterns.
RESPAWN_REDACT_PATTERNS = [
    line.strip()
    for line in os.environ.get("RESPAWN_REDACT_PATTERNS", "").splitlines()
    if line.strip()
]
# Secrets matched literally wherever they appear, in every process (a web process stores
# user input, so it must know the keys the workers use: give it the same settings). The
# provider keys, this deployment's own credentials, and the environment variables named
# in RESPAWN_REDACT_ENV (values, or NAME_FILE files, from the deployment's secret store).
RESPAWN_REDACT_ENV = env_list("RESPAWN_REDACT_ENV", [])
# `/metrics` answers this bearer token (or NAME_FILE's), an API token of a viewer, or a
# logged-in viewer.
RESPAWN_METRICS_TOKEN = env_secret("RESPAWN_METRICS_TOKEN")
# Keys that encrypt the secrets in what a run reads back (sessions_app.sealing): a
# comma-separated list (or RESPAWN_SEAL_KEYS_FILE), the first seals, every one opens.
# Unset: derived from SECRET_KEY, with SECRET_KEY_FALLBACKS opening too. To rotate, put
# the new key first, run `manage.py reseal`, then drop the old one.
SECRET_KEY_FALLBACKS = env_list("SECRET_KEY_FALLBACKS", [])
RESPAWN_SEAL_KEYS = [
    key.strip() for key in env_secret("RESPAWN_SEAL_KEYS").split(",") if key.strip()
] or [SECRET_KEY, *SECRET_KEY_FALLBACKS]
RESPAWN_REDACT_SECRETS = [
    *(key for key in RESPAWN_SEAL_KEYS if key != DEVELOPMENT_SECRET_KEY),
    RESPAWN_METRICS_TOKEN,
    OPENAI_API_KEY,
    ANTHROPIC_API_KEY,
    SECRET_KEY if SECRET_KEY != DEVELOPMENT_SECRET_KEY else "",
    DATABASES["default"].get("PASSWORD") or "",
    DATABASES.get("replica", {}).get("PASSWORD") or "",
    urlsplit(REDIS_URL).password or "",
    REDIS_PASSWORD,
    REDIS_SENTINEL_PASSWORD,
    *(env_secret(name) for name in RESPAWN_REDACT_ENV),
]
# Seconds an operator's action or an admin edit waits for a session row a worker holds
# (inside a tool's fenced write) before it answers "busy, try again", and any request for
# a lock another transaction holds before it answers 503 (PostgreSQL).
RESPAWN_LOCK_WAIT = env_float("RESPAWN_LOCK_WAIT", 2.0)
# An import (sessions_app.upkeep.transfer) unpacks a file in bounded pieces and refuses
# it as soon as it unpacks to more than this many bytes, or to more than this many times
# the compressed bytes read so far (a decompression bomb), before memory grows.
RESPAWN_IMPORT_MAX_BYTES = int(env_float("RESPAWN_IMPORT_MAX_BYTES", 256 * 2**20))
RESPAWN_IMPORT_MAX_RATIO = env_float("RESPAWN_IMPORT_MAX_RATIO", 100.0)
# Seconds one model call may take before it is abandoned and retried.
RESPAWN_MODEL_TIMEOUT = env_float("RESPAWN_MODEL_TIMEOUT", 60.0)
# Model prices (agent_runtime.pricing): inline JSON or a JSON file's path, over the
# built-in table; the system check names a bad entry (respawn.E030).
RESPAWN_PRICES = os.environ.get("RESPAWN_PRICES", "")
# Each worker serves its own process's Prometheus metrics on this port (0: off; the next
# free port when several workers share a host).
RESPAWN_WORKER_METRICS_PORT = int(env_float("RESPAWN_WORKER_METRICS_PORT", 0))

# --- Auth, i18n, static -----------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
# The throttle first: it refuses every log-in path (dashboard, admin, any other) while an
# account or an address is locked, before a password is checked (sessions_app/web/auth.py).
AUTHENTICATION_BACKENDS = [
    "sessions_app.web.auth.LoginThrottleBackend",
    # Django's password check, refusing what RESPAWN_PASSWORD_LOGIN does not allow.
    "sessions_app.web.sso.PasswordBackend",
    # Single sign-on over OpenID Connect (authenticates nobody unless configured).
    "sessions_app.web.sso.SsoBackend",
]
# Password log-in (the dashboard's and the admin's log-in pages). Off: only the superusers
# RESPAWN_BREAK_GLASS_USERS names may log in with a password; everyone else through single
# sign-on. API tokens are unaffected.
RESPAWN_PASSWORD_LOGIN = env_bool("RESPAWN_PASSWORD_LOGIN", True)
RESPAWN_BREAK_GLASS_USERS = env_list("RESPAWN_BREAK_GLASS_USERS", [])

# --- Single sign-on over OpenID Connect (sessions_app/web/sso.py; docs/DEPLOY.md) ---------
# On when RESPAWN_OIDC_CLIENT_ID and the authorization endpoint are set. The endpoints are
# the provider's (its /.well-known/openid-configuration lists them): Respawn fetches
# nothing at start.
RESPAWN_OIDC_PROVIDER_NAME = os.environ.get("RESPAWN_OIDC_PROVIDER_NAME", "")
RESPAWN_OIDC_ISSUER = os.environ.get("RESPAWN_OIDC_ISSUER", "")
OIDC_RP_CLIENT_ID = os.environ.get("RESPAWN_OIDC_CLIENT_ID", "")
OIDC_RP_CLIENT_SECRET = env_secret("RESPAWN_OIDC_CLIENT_SECRET")
OIDC_OP_AUTHORIZATION_ENDPOINT = os.environ.get("RESPAWN_OIDC_AUTHORIZATION_ENDPOINT", "")
OIDC_OP_TOKEN_ENDPOINT = os.environ.get("RESPAWN_OIDC_TOKEN_ENDPOINT", "")
OIDC_OP_USER_ENDPOINT = os.environ.get("RESPAWN_OIDC_USERINFO_ENDPOINT", "")
OIDC_OP_JWKS_ENDPOINT = os.environ.get("RESPAWN_OIDC_JWKS_ENDPOINT", "")
RESPAWN_OIDC_END_SESSION_ENDPOINT = os.environ.get("RESPAWN_OIDC_END_SESSION_ENDPOINT", "")
OIDC_RP_SIGN_ALGO = os.environ.get("RESPAWN_OIDC_SIGN_ALGO", "RS256")
OIDC_RP_SCOPES = os.environ.get("RESPAWN_OIDC_SCOPES", "openid email profile")
OIDC_USE_PKCE = True
OIDC_PKCE_CODE_CHALLENGE_METHOD = "S256"
OIDC_USE_NONCE = True
OIDC_STORE_ID_TOKEN = True  # the hint of the provider's logout
OIDC_TIMEOUT = env_float("RESPAWN_OIDC_TIMEOUT", 10)
OIDC_AUTHENTICATION_CALLBACK_URL = "sso-callback"
# The claims that name a person and list their groups, and what each group is here:
# RESPAWN_OIDC_ROLE_MAP=respawn-viewers:viewer,respawn-operators:operator,respawn-admins:admin
RESPAWN_OIDC_USERNAME_CLAIM = os.environ.get("RESPAWN_OIDC_USERNAME_CLAIM", "preferred_username")
RESPAWN_OIDC_GROUPS_CLAIM = os.environ.get("RESPAWN_OIDC_GROUPS_CLAIM", "groups")


def env_role_map(name: str) -> dict[str, str]:
    mapping = {}
    for item in env_list(name, []):
        group, _, role = item.rpartition(":")
        team, _, team_role = role.rpartition("/")
        known = (
            team_role in {"viewer", "operator", "team_admin"}
            if team
            else role in {"viewer", "operator", "admin"}
        )
        if not group or not known:
            raise SystemExit(
                f"{name}: {item!r} is not <provider group>:<role> (viewer, operator or admin"
                " in every team) or <provider group>:<team slug>/<role> (viewer, operator or"
                " team_admin in that team)"
            )
        mapping[group] = role
    return mapping


RESPAWN_OIDC_ROLE_MAP = env_role_map("RESPAWN_OIDC_ROLE_MAP")
# Log-in throttling: this many failures per account / per address within the window
# (seconds) lock further attempts until the window has passed.
RESPAWN_LOGIN_MAX_PER_ACCOUNT = int(env_float("RESPAWN_LOGIN_MAX_PER_ACCOUNT", 5))
RESPAWN_LOGIN_MAX_PER_IP = int(env_float("RESPAWN_LOGIN_MAX_PER_IP", 20))
RESPAWN_LOGIN_WINDOW = env_float("RESPAWN_LOGIN_WINDOW", 900)


def env_networks(name: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """Addresses and networks (`10.0.0.5`, `10.0.0.0/24`, `::1`), comma-separated."""
    networks = []
    for item in env_list(name, []):
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise SystemExit(
                f"{name}: {item!r} is not an IP address or network (e.g. 10.0.0.5, 10.0.0.0/24)"
            ) from None
    return tuple(networks)


# The reverse proxies in front of the web processes (their addresses or networks). A request
# from one of them is from the address its X-Forwarded-For names, read from the right past
# every trusted proxy; from anywhere else X-Forwarded-For is ignored (a client writes what
# it likes there). The log-in limits per address and the audit's address use it.
RESPAWN_TRUSTED_PROXIES = env_networks("RESPAWN_TRUSTED_PROXIES")
LOGIN_REDIRECT_URL = "sessions:list"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "static"
# WhiteNoise serves static files from the app itself (run `collectstatic` when deploying);
# outside production it serves them straight from the source folders.
WHITENOISE_USE_FINDERS = WHITENOISE_AUTOREFRESH = not PRODUCTION
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "whitenoise.storage.CompressedManifestStaticFilesStorage"
            if PRODUCTION and not env_bool("RESPAWN_PLAIN_STATIC", False)
            else "django.contrib.staticfiles.storage.StaticFilesStorage"
        )
    },
}

LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "request": {"format": "%(asctime)s %(message)s"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain"},
        # runserver's request lines (URLs with their query strings)
        "requests": {"class": "logging.StreamHandler", "formatter": "request"},
    },
    # Every logger reaches the root's handler, and through it the redacting filter: an
    # agent's own logger, a library's, Python's warnings (without a handler of the root's,
    # Python wrote their WARNING lines to stderr as they were).
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "respawn": {"level": os.environ.get("RESPAWN_LOG_LEVEL", "INFO")},
        "django": {"level": "WARNING"},
        # Python's warnings: to the root's handler only (Django's default config gives
        # them a handler of its own, which knows no redaction).
        "py.warnings": {"level": "WARNING"},
        "django.server": {"handlers": ["requests"], "level": "INFO", "propagate": False},
        # RQ's worker log (job descriptions, failures): through the same filter, and RQ
        # adds no handler of its own when one is configured.
        "rq": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}

# Log lines go through the same redaction as stored steps (request lines decoded first).
# A refused request (4xx) is one line, without the traceback of the exception that said no.
LOGGING["filters"] = {
    "redact": {"()": "sessions_app.logging.RedactingFilter"},
    "redact_urls": {"()": "sessions_app.logging.RedactingFilter", "decode_urls": True},
    "one_line_refusals": {"()": "sessions_app.logging.OneLineRefusals"},
}
for _name, _handler in LOGGING["handlers"].items():
    _handler["filters"] = (
        ["redact_urls"] if _name == "requests" else ["one_line_refusals", "redact"]
    )
