"""Model providers, registered by name and imported lazily (optional SDKs cost nothing
until an agent uses them). A model is named `provider:model`, e.g. `scripted:demo`,
`openai:gpt-4o-mini` (or a model of any OpenAI-compatible server), `anthropic:claude-sonnet-4-5`.
"""

from __future__ import annotations

import importlib
from typing import Any

from .base import Message, ModelSettings, ModelTurn, Provider, ProviderError, ToolCall, Usage

__all__ = [
    "Message",
    "ModelSettings",
    "ModelTurn",
    "Provider",
    "ProviderError",
    "ToolCall",
    "Usage",
    "PROVIDERS",
    "split_model_name",
    "make_provider",
]

# provider name -> "module:factory"; the factory takes (model, options) and returns a Provider
PROVIDERS: dict[str, str] = {
    "scripted": "agent_runtime.providers.scripted:ScriptedProvider",
    "openai": "agent_runtime.providers.openai:OpenAIProvider",
    "anthropic": "agent_runtime.providers.anthropic:AnthropicProvider",
}


def split_model_name(spec: str) -> tuple[str, str]:
    provider, sep, model = spec.partition(":")
    if not sep or not provider or not model:
        raise ValueError(f"model must look like 'provider:model', got {spec!r}")
    if provider not in PROVIDERS:
        known = ", ".join(sorted(PROVIDERS))
        raise ValueError(f"unknown model provider {provider!r} (known: {known})")
    return provider, model


def make_provider(spec: str, options: dict[str, Any] | None = None) -> tuple[Provider, str]:
    """Build the provider for `provider:model`; returns it with the bare model name."""
    provider, model = split_model_name(spec)
    module_name, _, attr = PROVIDERS[provider].partition(":")
    factory = getattr(importlib.import_module(module_name), attr)
    return factory(model=model, options=options or {}), model
