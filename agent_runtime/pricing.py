"""What a model call costs: a price table per provider and model, in US dollars per million
tokens, with separate prices for prompt-cache reads and writes.

The built-in table holds the list prices of common OpenAI and Anthropic models as published
when this release was made; a deployment replaces or extends it with RESPAWN_PRICES (a JSON
object, inline or in a file), so a negotiated rate or a new model is one setting away:

    {"openai:gpt-4o": {"input": 2.5, "output": 10, "cache_read": 1.25},
     "my-gateway:*": {"input": 0, "output": 0}}

A key is `provider:model`; a model matches the longest key that it starts with, so a dated
snapshot (`gpt-4o-2024-08-06`) takes its family's price, and `provider:*` prices every model
of a provider. A call whose provider reported a cost of its own keeps that cost.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .providers.base import Usage

PER = 1_000_000  # prices are per million tokens


@dataclass(frozen=True)
class Price:
    input: float
    output: float
    cache_read: float | None = None  # None: cached input costs what input costs
    cache_write: float | None = None

    def cost(self, usage: Usage) -> float:
        cache_read = min(usage.cache_read_tokens, usage.input_tokens)
        cache_write = min(usage.cache_write_tokens, usage.input_tokens - cache_read)
        plain = usage.input_tokens - cache_read - cache_write
        read_price = self.input if self.cache_read is None else self.cache_read
        write_price = self.input if self.cache_write is None else self.cache_write
        return (
            plain * self.input
            + cache_read * read_price
            + cache_write * write_price
            + usage.output_tokens * self.output
        ) / PER


def _p(input: float, output: float, cache_read: float | None = None, cache_write=None) -> Price:
    return Price(input, output, cache_read, cache_write)


# List prices, USD per million tokens (input, output, cache read, cache write).
BUILT_IN: dict[str, Price] = {
    "openai:gpt-5": _p(1.25, 10.0, 0.125),
    "openai:gpt-5-mini": _p(0.25, 2.0, 0.025),
    "openai:gpt-5-nano": _p(0.05, 0.40, 0.005),
    "openai:gpt-4.1": _p(2.0, 8.0, 0.50),
    "openai:gpt-4.1-mini": _p(0.40, 1.60, 0.10),
    "openai:gpt-4.1-nano": _p(0.10, 0.40, 0.025),
    "openai:gpt-4o": _p(2.50, 10.0, 1.25),
    "openai:gpt-4o-mini": _p(0.15, 0.60, 0.075),
    "openai:o3": _p(2.0, 8.0, 0.50),
    "openai:o4-mini": _p(1.10, 4.40, 0.275),
    "anthropic:claude-opus-4-5": _p(5.0, 25.0, 0.50, 6.25),
    "anthropic:claude-opus-4": _p(15.0, 75.0, 1.50, 18.75),
    "anthropic:claude-sonnet-4": _p(3.0, 15.0, 0.30, 3.75),
    "anthropic:claude-3-7-sonnet": _p(3.0, 15.0, 0.30, 3.75),
    "anthropic:claude-haiku-4-5": _p(1.0, 5.0, 0.10, 1.25),
    "anthropic:claude-3-5-haiku": _p(0.80, 4.0, 0.08, 1.0),
    # The scripted demo models cost nothing, and say so.
    "scripted:*": _p(0.0, 0.0),
}

FIELDS = ("input", "output", "cache_read", "cache_write")


class PriceTableError(ValueError):
    """RESPAWN_PRICES cannot be read; the message names the entry and the problem."""


class PriceTable:
    def __init__(self, prices: dict[str, Price]) -> None:
        self.prices = dict(prices)

    def price(self, provider: str, model: str) -> Price | None:
        """The price of `provider:model`: the longest key it starts with, else the
        provider's `*` entry, else None (unpriced)."""
        spec = f"{provider}:{model}"
        best = None
        for key in self.prices:
            if key.endswith(":*"):
                continue
            if spec == key or spec.startswith(key + "-") or spec.startswith(key + "@"):
                if best is None or len(key) > len(best):
                    best = key
        if best is not None:
            return self.prices[best]
        return self.prices.get(f"{provider}:*")

    def cost(self, provider: str, model: str, usage: Usage) -> float | None:
        """What the call cost: the provider's own figure if it gave one, else the table's
        (None: the model has no price)."""
        if usage.cost:
            return usage.cost
        price = self.price(provider, model)
        return None if price is None else price.cost(usage)

    def with_overrides(self, overrides: dict[str, Price]) -> PriceTable:
        return PriceTable({**self.prices, **overrides})


def parse_prices(raw: Any, *, source: str = "RESPAWN_PRICES") -> dict[str, Price]:
    """The prices in a decoded JSON object; PriceTableError names the first bad entry."""
    if not isinstance(raw, dict):
        raise PriceTableError(
            f"{source}: expected a JSON object of prices, got {type(raw).__name__}"
        )
    prices = {}
    for key, entry in raw.items():
        provider, sep, model = str(key).partition(":")
        if not sep or not provider or not model:
            raise PriceTableError(f"{source}: key {key!r} is not provider:model (or provider:*)")
        if not isinstance(entry, dict):
            raise PriceTableError(f"{source}[{key!r}]: expected an object with input and output")
        unknown = sorted(set(entry) - set(FIELDS))
        if unknown:
            raise PriceTableError(
                f"{source}[{key!r}]: unknown field(s) {', '.join(unknown)} "
                f"(known: {', '.join(FIELDS)})"
            )
        values = {}
        for name in FIELDS:
            value = entry.get(name)
            if value is None:
                if name in ("input", "output"):
                    raise PriceTableError(f"{source}[{key!r}]: {name} is required")
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise PriceTableError(
                    f"{source}[{key!r}].{name}: expected a price per million tokens "
                    f"(a number >= 0), got {value!r}"
                )
            values[name] = float(value)
        prices[str(key)] = Price(**values)
    return prices


def load_price_table(setting: str) -> PriceTable:
    """The built-in table with RESPAWN_PRICES applied: inline JSON (starting with `{` or
    `[`) or the path of a JSON file; "" for the built-in table alone."""
    setting = (setting or "").strip()
    if not setting:
        return PriceTable(BUILT_IN)
    if setting[0] in "{[":
        text, source = setting, "RESPAWN_PRICES"
    else:
        path = Path(setting)
        try:
            text = path.read_text()
        except OSError as exc:
            raise PriceTableError(f"RESPAWN_PRICES: cannot read {path}: {exc.strerror}") from None
        source = str(path)
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PriceTableError(f"{source}: not valid JSON: {exc}") from None
    return PriceTable(BUILT_IN).with_overrides(parse_prices(raw, source=source))
