"""Fixtures of the engine tests: the local model-protocol servers (tests/stubs/)."""

from ..stubs.llm_servers import anthropic_server, openai_server

__all__ = ["anthropic_server", "openai_server"]
