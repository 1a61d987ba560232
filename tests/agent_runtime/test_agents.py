"""The public agent API: definitions checked when built, versions, the compatibility rule,
the agent's own state, tools with and without a context, and what a run does with them."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import acme_agents
import pytest

from agent_runtime import (
    Agent,
    AgentConfigError,
    AgentRegistry,
    AgentState,
    AgentStateError,
    Limits,
    ModelTurn,
    ToolContext,
    ToolError,
    register_provider,
    scripted_model,
    tool,
    version_key,
)
from agent_runtime.loop import Outcome
from agent_runtime.providers import PROVIDERS, make_provider
from agent_runtime.state import SessionStatus
from agent_runtime.store import InMemoryEffects, InMemoryStore
from tests.agent_runtime.helpers import new_session, run


def acme(factory=acme_agents.agents_v1) -> AgentRegistry:
    return AgentRegistry(factory())


def last_answer(store: InMemoryStore, session_id: str) -> str:
    head = store.load_head(session_id)
    return head.checkpoint.state.final_answer


# --- definitions ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"name": "has spaces"}, "name must be 1-100 letters"),
        ({"name": ""}, "name must be 1-100 letters"),
        ({"version": ""}, "version must be a non-empty string"),
        ({"version": 2}, "version must be a non-empty string"),
        ({"model": "gpt-4o"}, "model must look like 'provider:model'"),
        ({"instructions": 42}, "instructions must be a string or a function"),
        ({"tools": [lambda ctx: 1]}, "tools[0] is a plain function, not a tool"),
        ({"tools": "calculator"}, "tools must be a list of tools"),
        ({"limits": Limits(max_steps=0)}, "max_steps must be a positive integer"),
        ({"limits": Limits(max_cost=-1)}, "max_cost must be a positive number"),
        ({"limits": Limits(max_parallel_tools=0)}, "max_parallel_tools must be a positive"),
        ({"state": AgentState(version=0)}, "state version must be a positive integer"),
        ({"state": AgentState(version=2, upgraders={2: dict})}, "must be a version below 2"),
        ({"compatible_since": "9"}, "compatible_since (9) is newer than the agent's own"),
    ],
)
def test_a_bad_definition_names_the_agent_and_the_problem(kwargs, message):
    fields = {"name": "helper", "model": "scripted:acme", **kwargs}
    with pytest.raises(AgentConfigError) as raised:
        Agent(**fields)
    assert message in str(raised.value)
    assert str(raised.value).startswith(f"agent {fields['name']!r}: ")


def test_two_tools_with_one_name_are_refused():
    @tool(name="look")
    def a(ctx: ToolContext, q: str) -> str:
        return q

    @tool(name="look")
    def b(ctx: ToolContext, q: str) -> str:
        return q

    with pytest.raises(AgentConfigError, match="two tools are named 'look'"):
        Agent(name="dup", model="scripted:acme", tools=[a, b])


def test_two_agents_with_one_name_are_refused():
    with pytest.raises(AgentConfigError, match="two agents are named 'acme'"):
        AgentRegistry([*acme_agents.agents_v1(), *acme_agents.agents_v2()])


def test_versions_order_as_people_read_them():
    ordered = ["", "1", "1.0rc1", "1.0.1", "1.9", "1.10", "2", "10", "2026-01-05", "2026-11-30"]
    assert sorted(ordered[::-1], key=version_key) == ordered


# --- tools ------------------------------------------------------------------------------


def test_a_tool_without_a_type_hint_fails_at_import_naming_the_parameter():
    with pytest.raises(TypeError, match="parameter 'query' needs a type hint"):

        @tool
        def lookup(ctx, query):
            return query


def test_a_tool_whose_parameters_have_no_json_schema_fails_at_import():
    with pytest.raises(TypeError, match="cannot become a JSON schema"):

        @tool
        def hold(ctx: ToolContext, lock: threading.Lock) -> dict:
            return {}


def test_a_tool_may_do_without_the_context_and_may_be_async():
    @tool
    def add(a: int, b: int = 1) -> int:
        """Add two numbers."""
        return a + b

    @tool
    async def slow_double(ctx: ToolContext, x: int) -> int:
        await asyncio.sleep(0)
        return 2 * x

    assert add.spec.parameters["required"] == ["a"]
    assert "ctx" not in slow_double.spec.parameters["properties"]

    def context(attempt: int) -> ToolContext:
        return ToolContext("s", "c", 1, "s:1", attempt, InMemoryEffects())

    assert add.run(context, {"a": 2}).output == 3
    assert slow_double.run(context, {"x": 21}).output == 42
    refused = add.run(context, {"a": "x"})
    assert not refused.ok and "invalid arguments for add: a:" in refused.error


def test_ctx_state_in_an_agent_without_state_is_a_clear_tool_error():
    @tool
    def remember(ctx: ToolContext, x: int) -> int:
        ctx.state["x"] = x
        return x

    outcome = remember.run(lambda attempt: ToolContext("s", "c", 1, "k", attempt, None), {"x": 1})
    assert not outcome.ok
    assert "keeps no state of its own; give it state=AgentState(...)" in outcome.error


def test_a_state_change_is_recorded_by_key_and_dropped_when_the_call_fails():
    stored = {"version": 3, "data": {"a": 1, "b": [1], "gone": True}}

    @tool
    def change(ctx: ToolContext, fail: bool) -> str:
        ctx.state["b"].append(2)
        ctx.state["c"] = "new"
        del ctx.state["gone"]
        if fail:
            raise ToolError("nope")
        return "ok"

    def context(attempt: int) -> ToolContext:
        return ToolContext("s", "c", 1, "k", attempt, None, agent_state=stored)

    ok = change.run(context, {"fail": False})
    assert ok.agent_state == {"version": 3, "set": {"b": [1, 2], "c": "new"}, "unset": ["gone"]}
    assert stored == {"version": 3, "data": {"a": 1, "b": [1], "gone": True}}  # not touched
    assert change.run(context, {"fail": True}).agent_state is None


# --- providers --------------------------------------------------------------------------


def test_scripted_models_and_providers_register_by_name():
    @scripted_model("test-hello")
    def hello(messages):
        return ModelTurn(text="hello")

    with pytest.raises(ValueError, match="registered already"):
        scripted_model("test-hello")(lambda messages: ModelTurn(text="other"))

    class Fixed:
        def __init__(self, *, model: str, options: dict[str, Any]) -> None:
            self.model = model

        def complete(self, messages, tools, settings):
            return ModelTurn(text=f"fixed {self.model}")

    register_provider("test-fixed", Fixed)
    try:
        provider, name = make_provider("test-fixed:m1")
        assert name == "m1" and provider.complete([], [], None).text == "fixed m1"
        with pytest.raises(ValueError, match="registered already"):
            register_provider("test-fixed", "somewhere:Else")
    finally:
        PROVIDERS.pop("test-fixed")


# --- the compatibility rule -------------------------------------------------------------


def test_the_rule_refuses_a_session_a_newer_version_ran_and_those_declared_incompatible():
    v2 = acme_agents.agents_v2()[0]
    assert v2.refusal(started="1", last_ran="1") is None  # continues on a newer version
    assert v2.refusal(started="", last_ran=None) is None  # recorded before versions were
    assert "already ran on version 3, newer than this worker's version 2" in v2.refusal(
        started="1", last_ran="3"
    )
    v4 = acme_agents.agents_incompatible()[0]
    assert v4.refusal(started="4", last_ran="4") is None
    assert "does not continue sessions started before version 4 (this one started on 2)" in (
        v4.refusal(started="2", last_ran="3")
    )


# --- agent state ------------------------------------------------------------------------


def test_agent_state_loads_upgrades_and_refuses_what_it_cannot_read():
    state = acme_agents.STATE_V2
    fresh, applied = state.load(None)
    assert fresh == {"version": 2, "data": {"tickets": []}} and applied == ()
    upgraded, applied = state.load({"version": 1, "data": {"tickets": ["A"]}})
    assert upgraded == {"version": 2, "data": {"tickets": [{"title": "A", "status": "open"}]}}
    assert applied == ("1->2",)
    with pytest.raises(AgentStateError, match="version 3, newer than this code's"):
        state.load({"version": 3, "data": {}})
    no_path = AgentState(version=3, upgraders={2: dict})
    with pytest.raises(AgentStateError, match="no upgrader from agent state version 1 to 2"):
        no_path.load({"version": 1, "data": {}})
    broken = AgentState(version=2, upgraders={1: lambda data: data["missing"]})
    with pytest.raises(AgentStateError, match="upgrader from version 1 raised KeyError"):
        broken.load({"version": 1, "data": {}})


def test_a_session_keeps_its_agent_state_across_turns_and_checkpoints():
    store = InMemoryStore()
    agents = acme()
    session_id = new_session(store, "acme", "open ticket A")
    assert run(store, session_id, agents=agents).outcome == Outcome.COMPLETED
    store.add_user_message(session_id, "open ticket B")
    assert run(store, session_id, agents=agents).outcome == Outcome.COMPLETED
    head = store.load_head(session_id)
    assert head.checkpoint.state.agent_state == {"version": 1, "data": {"tickets": ["A", "B"]}}
    assert last_answer(store, session_id) == "Opened B; 2 open."
    results = [s for s in head.history if s.kind == "tool_result"]
    assert results[-1].payload["agent_state"] == {
        "version": 1,
        "set": {"tickets": ["A", "B"]},
        "unset": [],
    }


def test_the_instructions_function_sees_the_state_before_every_model_call():
    store = InMemoryStore()
    agents = acme()
    session_id = new_session(store, "acme", "open ticket A")
    run(store, session_id, agents=agents)
    calls = []

    def recording(spec, options):
        provider, name = make_provider(spec, options)

        class Recording:
            def complete(self, messages, tools, settings):
                calls.append(messages[0].content)
                return provider.complete(messages, tools, settings)

        return Recording(), name

    session_id = new_session(store, "acme", "what do you do?")
    run(store, session_id, agents=agents, make_provider=recording)
    assert calls == ["You handle ACME support tickets. 0 on file."]
    assert (
        last_answer(store, session_id)
        == "Instructions: You handle ACME support tickets. 0 on file."
    )


def test_an_upgraded_agent_state_is_recorded_whole_when_the_run_starts():
    store = InMemoryStore()
    session_id = new_session(store, "acme", "open ticket A")
    run(store, session_id, agents=acme())
    store.add_user_message(session_id, "open ticket B")
    assert run(store, session_id, agents=acme(acme_agents.agents_v2)).outcome == "completed"
    head = store.load_head(session_id)
    started = [s for s in head.history if s.payload.get("event") == "run_started"][-1]
    assert started.payload["agent_version"] == "2"
    assert started.payload["agent_state_upgraders"] == ["1->2"]
    assert started.payload["agent_state"] == {
        "version": 2,
        "data": {"tickets": [{"title": "A", "status": "open"}]},
    }
    assert head.checkpoint.state.agent_version == "2"
    assert head.checkpoint.state.agent_data["tickets"][-1] == {"title": "B", "status": "open"}
    assert last_answer(store, session_id) == "Opened B; 2 open."


@pytest.mark.parametrize(
    "factory, message",
    [
        (acme_agents.agents_no_upgrader, "no upgrader from agent state version 1 to 2"),
        (acme_agents.agents_incompatible, "does not continue sessions started before version 4"),
    ],
)
def test_a_session_this_code_cannot_continue_is_refused_and_nothing_is_written(factory, message):
    store = InMemoryStore()
    session_id = new_session(store, "acme", "open ticket A")
    store.session(session_id).agent_version = "1"
    run(store, session_id, agents=acme())
    store.add_user_message(session_id, "open ticket B")
    before = list(store.session(session_id).steps)
    result = run(store, session_id, agents=acme(factory))
    assert result.outcome == Outcome.INCOMPATIBLE and message in result.error
    assert store.session(session_id).steps == before
    assert store.session(session_id).lease_owner is None


def test_a_worker_with_an_older_agent_version_leaves_the_session_alone():
    store = InMemoryStore()
    session_id = new_session(store, "acme", "open ticket A")
    run(store, session_id, agents=acme(acme_agents.agents_v2))
    store.add_user_message(session_id, "open ticket B")
    result = run(store, session_id, agents=acme())
    assert result.outcome == Outcome.INCOMPATIBLE
    assert "already ran on version 2, newer than this worker's version 1" in result.error


def test_a_missing_agent_is_a_refusal_not_a_failure():
    store = InMemoryStore()
    session_id = new_session(store, "gone", "hello")
    result = run(store, session_id, agents=acme())
    assert result.outcome == Outcome.INCOMPATIBLE
    assert "unknown agent 'gone' on this worker" in result.error
    assert [s.kind for s in store.session(session_id).steps] == ["user"]


# --- limits -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "limits, message",
    [
        (Limits(max_tokens=10), "token limit of 10 reached"),
        (Limits(max_steps=3), "step limit of 3 reached"),
    ],
)
def test_a_session_pauses_at_its_limits(limits, message):
    agent = Agent(
        name="acme",
        model="scripted:acme",
        tools=acme_agents.agents_v1()[0].tools,
        state=acme_agents.STATE_V1,
        limits=limits,
    )
    store = InMemoryStore()
    session_id = new_session(store, "acme", "work 5")
    result = run(store, session_id, agents=AgentRegistry([agent]))
    assert result.outcome == Outcome.PAUSED and message in result.error
    assert store.session(session_id).status == SessionStatus.PAUSED


def test_a_cost_limit_pauses_the_session_before_the_next_model_call():
    class Priced:
        def __init__(self, *, model: str, options: dict[str, Any]) -> None:
            pass

        def complete(self, messages, tools, settings):
            from agent_runtime import ToolCall, Usage

            return ModelTurn(
                text="again",
                tool_calls=[ToolCall(f"c{len(messages)}", "work", {"step": 1})],
                usage=Usage(input_tokens=10, output_tokens=10, cost=0.02),
            )

    register_provider("test-priced", Priced)
    try:
        agent = Agent(
            name="pricey",
            model="test-priced:m",
            tools=acme_agents.agents_v1()[0].tools,
            limits=Limits(max_cost=0.05),
        )
        store = InMemoryStore()
        session_id = new_session(store, "pricey", "go")
        result = run(store, session_id, agents=AgentRegistry([agent]))
    finally:
        PROVIDERS.pop("test-priced")
    assert result.outcome == Outcome.PAUSED
    assert "cost limit of 0.05 reached (0.06 spent)" in result.error


def test_a_tool_reports_progress_on_the_session_under_its_lease():
    store = InMemoryStore()
    session_id = new_session(store, "acme", "work 1")
    run(store, session_id, agents=acme())
    assert store.session(session_id).progress == (1, 1, "step 1 done")


def test_annotated_constraints_reach_the_schema_and_the_validation():
    from typing import Annotated, Literal

    from pydantic import Field

    @tool
    def refund(
        ctx: ToolContext,
        amount_cents: Annotated[int, Field(gt=0, le=500)],
        speed: Literal["slow", "fast"] = "slow",
    ) -> int:
        return amount_cents

    props = refund.spec.parameters["properties"]
    assert props["amount_cents"] == {"type": "integer", "exclusiveMinimum": 0, "maximum": 500}
    assert props["speed"]["enum"] == ["slow", "fast"]
    outcome = refund.run(lambda a: ToolContext("s", "c", 1, "k", a, None), {"amount_cents": 0})
    assert not outcome.ok and "amount_cents: Input should be greater than 0" in outcome.error


def test_an_agent_that_keeps_no_state_gives_its_tools_none_whatever_the_session_recorded():
    # A session an agent with state ran, continued by a version of it that keeps none: its
    # tools see no agent state (as a fan-out branch's always did), not the stale one.
    seen = []

    @tool
    def peek(ctx: ToolContext) -> str:
        seen.append(ctx.agent_state)
        return "ok"

    class Peeking:
        def __init__(self, *, model: str, options: dict[str, Any]) -> None:
            pass

        def complete(self, messages, tools, settings):
            from agent_runtime import ToolCall

            if messages[-1].role == "tool":
                return ModelTurn(text="done")
            return ModelTurn(text=None, tool_calls=[ToolCall(f"c{len(messages)}", "peek", {})])

    store = InMemoryStore()
    session_id = new_session(store, "acme", "open ticket A")
    run(store, session_id, agents=acme())
    assert store.load_head(session_id).checkpoint.state.agent_state is not None
    register_provider("test-peeking", Peeking)
    try:
        stateless = Agent(name="acme", version="1", model="test-peeking:m", tools=[peek])
        store.add_user_message(session_id, "peek")
        result = run(store, session_id, agents=AgentRegistry([stateless]))
    finally:
        PROVIDERS.pop("test-peeking")
    assert result.outcome == Outcome.COMPLETED
    assert seen == [None]
