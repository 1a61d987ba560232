"""Fixtures of the engine tests: the local model-protocol servers (tests/stubs/) and the
kit that runs a test once per provider (provider_kit.py)."""

from ..stubs.llm_servers import anthropic_server, openai_server
from .provider_kit import kit

__all__ = ["anthropic_server", "kit", "openai_server"]
