"""True costs: each model step records what it cost, from the provider's usage (cache reads
and writes priced apart) and the price table, overridable by RESPAWN_PRICES."""

from __future__ import annotations

import json

import pytest

from agent_runtime.pricing import (
    BUILT_IN,
    Price,
    PriceTable,
    PriceTableError,
    load_price_table,
)
from agent_runtime.providers.base import Usage
from agent_runtime.state import StepKind
from agent_runtime.store import InMemoryStore

from .helpers import new_session
from .provider_kit import run_agent

# --- The table --------------------------------------------------------------------------


def test_a_dated_snapshot_takes_its_familys_price_and_the_longest_key_wins():
    table = PriceTable(BUILT_IN)
    assert table.price("openai", "gpt-4o-2024-08-06") == BUILT_IN["openai:gpt-4o"]
    assert table.price("openai", "gpt-4o-mini-2024-07-18") == BUILT_IN["openai:gpt-4o-mini"]
    assert (
        table.price("anthropic", "claude-sonnet-4-5-20250929")
        == BUILT_IN["anthropic:claude-sonnet-4"]
    )
    assert table.price("anthropic", "claude-opus-4-5") == BUILT_IN["anthropic:claude-opus-4-5"]
    # A prefix that is not a whole name part does not match.
    assert table.price("openai", "gpt-4oxyz") is None
    assert table.price("scripted", "anything") == Price(0.0, 0.0)
    assert table.price("nobody", "m") is None


def test_cache_reads_and_writes_are_priced_apart():
    price = Price(input=3.0, output=15.0, cache_read=0.30, cache_write=3.75)
    usage = Usage(
        input_tokens=1_110_000,
        output_tokens=20_000,
        cache_read_tokens=1_000_000,
        cache_write_tokens=100_000,
    )
    # 10k plain input, 1M read from the cache, 100k written to it, 20k out.
    expected = 0.01 * 3.0 + 1.0 * 0.30 + 0.1 * 3.75 + 0.02 * 15.0
    assert price.cost(usage) == pytest.approx(expected)
    # Without cache prices, cached input costs what input costs.
    assert Price(1.0, 2.0).cost(usage) == pytest.approx(1.11 * 1.0 + 0.02 * 2.0)


def test_a_providers_own_cost_wins_over_the_table():
    table = PriceTable(BUILT_IN)
    assert table.cost("openai", "gpt-4o", Usage(1000, 1000, cost=0.5)) == 0.5
    assert table.cost("nobody", "m", Usage(1000, 1000)) is None


def test_overrides_replace_and_extend_the_built_in_table(tmp_path):
    inline = load_price_table(
        '{"openai:gpt-4o": {"input": 1, "output": 2}, "gateway:*": {"input": 0.5, "output": 0.5}}'
    )
    assert inline.price("openai", "gpt-4o") == Price(1.0, 2.0)
    assert inline.price("gateway", "any-model") == Price(0.5, 0.5)
    assert inline.price("openai", "gpt-4o-mini") == BUILT_IN["openai:gpt-4o-mini"]  # kept
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"anthropic:claude-x": {"input": 1, "output": 5, "cache_read": 0}}))
    assert load_price_table(str(path)).price("anthropic", "claude-x") == Price(1.0, 5.0, 0.0)


@pytest.mark.parametrize(
    "setting, message",
    [
        ("{not json", "RESPAWN_PRICES: not valid JSON"),
        ("[1]", "expected a JSON object of prices, got list"),
        ('{"gpt-4o": {"input": 1, "output": 1}}', "key 'gpt-4o' is not provider:model"),
        ('{"openai:m": {"input": 1}}', "RESPAWN_PRICES['openai:m']: output is required"),
        ('{"openai:m": {"input": -1, "output": 1}}', "input: expected a price per million"),
        ('{"openai:m": {"input": 1, "output": 1, "cached": 1}}', "unknown field(s) cached"),
        ("/nonexistent/prices.json", "cannot read /nonexistent/prices.json"),
    ],
)
def test_a_bad_price_setting_names_the_entry_and_the_problem(setting, message):
    with pytest.raises(PriceTableError) as caught:
        load_price_table(setting)
    assert message in str(caught.value)


# --- Recorded on each model step, from what the vendor's API reported -------------------


@pytest.mark.parametrize("kit", ["openai"], indirect=True)
def test_openai_steps_record_their_cost_with_cached_input_at_the_cache_price(kit):
    first = kit.reply(None, (("c1", "calculator", {"expression": "1+1"}),), usage=(2000, 100))
    first.body["usage"]["prompt_tokens_details"] = {"cached_tokens": 1500}
    kit.server.script(first, kit.reply("2", usage=(3000, 10)))
    store = InMemoryStore()
    session_id = new_session(store, "calc", "1+1?")

    run_agent(store, session_id, kit.model, kit.options())

    price = BUILT_IN["openai:gpt-4o-mini"]
    steps = [s for s in store.session(session_id).steps if s.kind == StepKind.MODEL]
    usage = steps[0].payload["usage"]
    assert usage["cache_read_tokens"] == 1500 and "cache_write_tokens" not in usage
    assert usage["cost"] == pytest.approx(
        (500 * price.input + 1500 * price.cache_read + 100 * price.output) / 1e6
    )
    assert steps[1].payload["usage"]["cost"] == pytest.approx(
        (3000 * price.input + 10 * price.output) / 1e6
    )
    state = store.session(session_id).checkpoints[-1].state
    assert state.counters.cost == pytest.approx(sum(s.payload["usage"]["cost"] for s in steps))


@pytest.mark.parametrize("kit", ["anthropic"], indirect=True)
def test_anthropic_steps_record_cache_writes_and_reads_at_their_prices(kit):
    reply = kit.reply("2", usage=(10, 40))
    reply.body["usage"].update(cache_creation_input_tokens=200, cache_read_input_tokens=4000)
    kit.server.script(reply)
    store = InMemoryStore()
    session_id = new_session(store, "calc", "1+1?")

    run_agent(store, session_id, kit.model, kit.options())

    price = BUILT_IN["anthropic:claude-sonnet-4"]
    (step,) = [s for s in store.session(session_id).steps if s.kind == StepKind.MODEL]
    usage = step.payload["usage"]
    assert (usage["input_tokens"], usage["cache_read_tokens"], usage["cache_write_tokens"]) == (
        4210,
        4000,
        200,
    )
    assert usage["cost"] == pytest.approx(
        (10 * price.input + 4000 * price.cache_read + 200 * price.cache_write + 40 * price.output)
        / 1e6
    )
    assert "unpriced" not in usage


@pytest.mark.parametrize("kit", ["openai"], indirect=True)
def test_a_model_without_a_price_is_marked_unpriced_and_an_override_prices_it(kit):
    kit.server.script(kit.reply("2", usage=(1000, 1000)), kit.reply("3", usage=(1000, 1000)))
    model = "openai:local-llama"
    store = InMemoryStore()
    first = new_session(store, "calc", "1+1?")
    run_agent(store, first, model, kit.options())
    (step,) = [s for s in store.session(first).steps if s.kind == StepKind.MODEL]
    assert step.payload["usage"]["cost"] == 0 and step.payload["usage"]["unpriced"] is True

    prices = load_price_table('{"openai:local-llama": {"input": 1, "output": 3}}')
    second = new_session(store, "calc", "1+2?")
    run_agent(store, second, model, kit.options(), prices=prices)
    (step,) = [s for s in store.session(second).steps if s.kind == StepKind.MODEL]
    assert step.payload["usage"]["cost"] == pytest.approx((1000 * 1 + 1000 * 3) / 1e6)
    assert "unpriced" not in step.payload["usage"]
