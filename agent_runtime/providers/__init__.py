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
    "register_provider",
]

# provider name -> "module:factory" (or the factory); the factory takes (model, options) and
# returns a Provider
PROVIDERS: dict[str, Any] = {
    "scripted": "agent_runtime.providers.scripted:ScriptedProvider",
    "openai": "agent_runtime.providers.openai:OpenAIProvider",
    "anthropic": "agent_runtime.providers.anthropic:AnthropicProvider",
}


def register_provider(name: str, factory: str | Any) -> None:
    """Add a model provider: `factory` is a "module:callable" path (imported on first use)
    or the callable itself, taking (model=..., options=...) and returning an object with
    `complete(messages, tools, settings) -> ModelTurn`. Agents then name models
    `<name>:<model>`."""
    if not name or ":" in name:
        raise ValueError(f"a provider name must be non-empty and without ':', got {name!r}")
    known = PROVIDERS.get(name)
    if known is not None and known is not factory:
        raise ValueError(f"a model provider named {name!r} is registered already")
    PROVIDERS[name] = factory


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
    factory = PROVIDERS[provider]
    if isinstance(factory, str):
        module_name, _, attr = factory.partition(":")
        factory = getattr(importlib.import_module(module_name), attr)
    return factory(model=model, options=options or {}), model
