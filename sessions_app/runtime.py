"""Builds the engine's pieces (agents, config) from Django settings: the only place that
translates settings into agent_runtime's dataclasses."""

from __future__ import annotations

import functools
import logging
import os
import socket
import uuid

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from agent_runtime.agents import AgentRegistry
from agent_runtime.discovery import Discovery, discover
from agent_runtime.loop import RunConfig
from agent_runtime.pricing import PriceTable, load_price_table
from agent_runtime.redaction import Redactor
from agent_runtime.telemetry import Telemetry, combine
from agent_runtime.tools import TransientRetry, is_infrastructure_error

log = logging.getLogger("respawn.runtime")


@functools.cache
def discovered() -> Discovery:
    """The agents of RESPAWN_AGENTS and the `respawn.agents` entry points, with every
    problem found loading them (imported once per process)."""
    return discover(settings.RESPAWN_AGENTS, entry_points=settings.RESPAWN_AGENT_ENTRY_POINTS)


def agent_registry() -> AgentRegistry:
    """The agents this process runs. The system check (sessions_app.checks) refuses to
    start a process whose agents have problems; this raises in any other path to them."""
    found = discovered()
    if found.problems:
        raise ImproperlyConfigured(
            "the configured agents cannot be loaded: " + "; ".join(str(p) for p in found.problems)
        )
    return _registry()


@functools.cache
def _registry() -> AgentRegistry:
    return discovered().registry()


def agent_version(name: str) -> str:
    """The version this process runs of agent `name` ("" when it has no such agent)."""
    registry = agent_registry()
    return registry.get(name).version if name in registry else ""


def worker_identity() -> str:
    """Unique per run: host, process and a random suffix (a lease owner name)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@functools.cache
def redactor() -> Redactor:
    """Built-in patterns, the deployment's own (RESPAWN_REDACT_PATTERNS), and the
    configured secrets (provider keys and the rest of RESPAWN_REDACT_SECRETS) matched
    literally."""
    return Redactor(
        extra_patterns=settings.RESPAWN_REDACT_PATTERNS,
        secrets=settings.RESPAWN_REDACT_SECRETS,
    )


@functools.cache
def price_table() -> PriceTable:
    """The built-in prices with RESPAWN_PRICES applied (the system check has named any
    problem with the setting before a worker starts)."""
    return load_price_table(settings.RESPAWN_PRICES)


@functools.cache
def telemetry() -> Telemetry:
    """This process's metrics (always counted; served by workers on
    RESPAWN_WORKER_METRICS_PORT) and, when the OTEL_* variables ask for them, traces."""
    from .telemetry import OpenTelemetryTelemetry, PrometheusTelemetry, tracer_from_environment

    parts: list[Telemetry] = [PrometheusTelemetry()]
    try:
        tracer = tracer_from_environment()
    except (ImportError, ValueError) as exc:  # the system check (respawn.E031) names it
        log.error("OpenTelemetry traces are off: %s", exc)
        tracer = None
    if tracer is not None:
        parts.append(OpenTelemetryTelemetry(tracer))
    return combine(parts)


def is_transient(exc: BaseException) -> bool:
    """An error of the infrastructure under a tool: the engine's list (database drivers,
    Redis, connection errors and timeouts) and Django's wrappers of the driver's
    connection errors (a database down, restarting or out of connection slots)."""
    from django.db import InterfaceError, OperationalError

    return isinstance(exc, OperationalError | InterfaceError) or is_infrastructure_error(exc)


def is_store_fault(exc: BaseException) -> bool:
    """The database failing under a run (down, restarting, its disk full, a lock or a
    statement timed out): Django's OperationalError and InterfaceError."""
    from django.db import InterfaceError, OperationalError

    return isinstance(exc, OperationalError | InterfaceError)


def run_config() -> RunConfig:
    return RunConfig(
        prices=price_table(),
        telemetry=telemetry(),
        worker_id=worker_identity(),
        lease_ttl=settings.RESPAWN_LEASE_TTL,
        model_retries=settings.RESPAWN_MODEL_RETRIES,
        model_backoff=settings.RESPAWN_MODEL_BACKOFF,
        model_override=settings.RESPAWN_MODEL or None,
        model_timeout=settings.RESPAWN_MODEL_TIMEOUT,
        # No redactor: what a run reads back is kept exactly; the Django store seals a
        # payload or state that holds a secret (sessions_app.sealing).
        is_store_fault=is_store_fault,
        max_crashes=settings.RESPAWN_MAX_CRASHES,
        transient=TransientRetry(
            retry_for=settings.RESPAWN_TRANSIENT_RETRY_FOR, is_transient=is_transient
        ),
        provider_options={
            "openai_base_url": settings.OPENAI_BASE_URL,
            "openai_api_key": settings.OPENAI_API_KEY,
            "anthropic_base_url": settings.ANTHROPIC_BASE_URL,
            "anthropic_api_key": settings.ANTHROPIC_API_KEY,
        },
    )


def reset_agents() -> None:
    """Forget the loaded agents (settings changed, e.g. in a test); the next use imports
    them again."""
    discovered.cache_clear()
    _registry.cache_clear()
