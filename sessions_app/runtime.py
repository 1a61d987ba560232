"""Builds the engine's pieces (agents, config) from Django settings: the only place that
translates settings into agent_runtime's dataclasses."""

from __future__ import annotations

import functools
import os
import socket
import uuid

from django.conf import settings

from agent_runtime.agents import AgentRegistry, demo_agents
from agent_runtime.loop import RunConfig
from agent_runtime.redaction import Redactor


@functools.cache
def agent_registry() -> AgentRegistry:
    return demo_agents(
        slow_delay=settings.RESPAWN_SLOW_DELAY,
        batch_delay=settings.RESPAWN_BATCH_DELAY,
        research_delay=settings.RESPAWN_RESEARCH_DELAY,
        research_parallel=settings.RESPAWN_RESEARCH_PARALLEL,
    )


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


def run_config() -> RunConfig:
    return RunConfig(
        worker_id=worker_identity(),
        lease_ttl=settings.RESPAWN_LEASE_TTL,
        model_retries=settings.RESPAWN_MODEL_RETRIES,
        model_backoff=settings.RESPAWN_MODEL_BACKOFF,
        model_override=settings.RESPAWN_MODEL or None,
        model_timeout=settings.RESPAWN_MODEL_TIMEOUT,
        redactor=redactor(),
        max_crashes=settings.RESPAWN_MAX_CRASHES,
        provider_options={
            "openai_base_url": settings.OPENAI_BASE_URL,
            "openai_api_key": settings.OPENAI_API_KEY,
            "anthropic_base_url": settings.ANTHROPIC_BASE_URL,
            "anthropic_api_key": settings.ANTHROPIC_API_KEY,
        },
    )
