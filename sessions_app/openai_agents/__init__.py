"""OpenAI Agents SDK agents on Respawn (needs the `openai-agents` extra): `session` holds
RespawnSession (the SDK's Session protocol on Respawn's steps) and openai_agent (an SDK agent
run on the workers through the engine's Runner protocol). Everything a program imports is
here: `from sessions_app.openai_agents import RespawnSession, openai_agent`."""

from .session import (
    OpenAIAgentRunner,
    RespawnSession,
    RunStateVersionError,
    SessionBusy,
    openai_agent,
    session_id_for,
)

__all__ = [
    "OpenAIAgentRunner",
    "RespawnSession",
    "RunStateVersionError",
    "SessionBusy",
    "openai_agent",
    "session_id_for",
]
