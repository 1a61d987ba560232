"""Respawn's engine: durable agent sessions in plain Python.

Nothing in this package imports Django. It talks to storage through
`agent_runtime.store.SessionStore` and is configured by the dataclasses it is handed.

The public API for writing agents is what this module exports:

    from agent_runtime import Agent, AgentState, Limits, ToolContext, ToolError, tool

A tool's `ctx.fenced()` raises `LeaseLost` when the run no longer holds its session (let it
propagate: the run stops, and a call that is not idempotent is reported).

An agent whose turn loop is another framework's takes a `runner` instead of a model and
tools (`agent_runtime.runners`: Runner, RunContext, RunnerResult, RunnerCancelled).

Agents are found by the Django side from `RESPAWN_AGENTS` (`module:attribute` paths) and
the `respawn.agents` entry-point group (see `agent_runtime.discovery`).
"""

from .agents import (
    Agent,
    AgentConfigError,
    AgentRegistry,
    AgentState,
    AgentStateError,
    Limits,
    UnknownAgent,
    version_key,
)
from .providers import (
    Message,
    ModelSettings,
    ModelTurn,
    ProviderError,
    ToolCall,
    Usage,
    register_provider,
)
from .providers.scripted import scripted_model
from .runners import RunContext, Runner, RunnerCancelled, RunnerResult, RunnerStatus
from .state import SessionState
from .store import LeaseLost
from .tools import Tool, ToolContext, ToolError, tool

__all__ = [
    "Agent",
    "AgentConfigError",
    "AgentRegistry",
    "AgentState",
    "AgentStateError",
    "LeaseLost",
    "Limits",
    "Message",
    "ModelSettings",
    "ModelTurn",
    "ProviderError",
    "RunContext",
    "Runner",
    "RunnerCancelled",
    "RunnerResult",
    "RunnerStatus",
    "SessionState",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "Usage",
    "UnknownAgent",
    "register_provider",
    "scripted_model",
    "tool",
    "version_key",
]
