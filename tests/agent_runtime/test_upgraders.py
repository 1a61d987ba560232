"""Versioned loaders: frozen fixtures of every released version, refusals, round trips, and
a property test that an upgraded history reads to a model exactly as it did before."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_runtime.loop import build_messages
from agent_runtime.providers import Message, ToolCall
from agent_runtime.state import (
    SCHEMA_VERSION,
    PlanItem,
    StepKind,
    StepRecord,
    describe_step,
    replan,
)
from agent_runtime.upgraders import (
    STATE_DOWNGRADERS,
    STATE_UPGRADERS,
    STEP_DOWNGRADERS,
    STEP_UPGRADERS,
    IncompatibleSchemaError,
    downgrade_state_blob,
    downgrade_step_payload,
    load_state,
    load_step_payload,
    state_v1_to_v2,
    step_v1_to_v2,
    upgrade_state_blob,
)
from demo_agents import demo_agents
from tests.fixtures.loader import FIXTURES, V1_SESSIONS, V2_SESSIONS, read_fixture

# The fixtures are released data: changing one rewrites history. A new version adds new
# fixtures beside these; re-pinning a digest is never the fix for this test failing.
PINNED_DIGESTS = {
    "v1/completed.json": "de9d3d96bbe24def377985b38362cb64cfda50fff98d11ed5190477ad50d3b8c",
    "v1/failed.json": "f2e1f2fe10c4b1029d3fc7348a8769eb2de60333279267691b37fb1665c639f9",
    "v1/mid_run.json": "dcd1bb26718bad1d732b2e64fc96f7f79620181e046020bad86b89d49c0105dd",
    "v1/waiting_approval.json": "207b345c1720c556d25e6769a24eb35573ca1de8c7421b14e5c748acadefa40e",
    "v2/completed.json": "29dfbe3805ad2347d155a25cbd95cb55d3cdf24d34621b062bfc9e3ebbc4531c",
    "v2/failed.json": "e1e2a72440e95cffdc3a14443f7500fdee8b4cbbd8bc8b666b14b18decd37346",
    "v2/mid_run.json": "d48d031ae5ee5907c6d09511d0951042666541b747d82e68527b0094d2d9d9d9",
    "v2/waiting_approval.json": "5b27ea54e9060ad240041f720d9872cb698bd78e2e842c358bb9cd477cbc0314",
}


def test_chains_cover_every_released_version_and_each_has_frozen_fixtures():
    assert sorted(STATE_UPGRADERS) == sorted(STEP_UPGRADERS) == list(range(1, SCHEMA_VERSION))
    assert (
        sorted(STATE_DOWNGRADERS) == sorted(STEP_DOWNGRADERS) == list(range(2, SCHEMA_VERSION + 1))
    )
    for version in range(1, SCHEMA_VERSION):
        assert list((FIXTURES / f"v{version}").glob("*.json")), f"no frozen v{version} sessions"


def test_frozen_fixtures_are_unchanged():
    for path, digest in PINNED_DIGESTS.items():
        assert hashlib.sha256((FIXTURES / path).read_bytes()).hexdigest() == digest, path
    assert {f"v1/{name}.json" for name in V1_SESSIONS} <= set(PINNED_DIGESTS)
    assert {f"v2/{name}.json" for name in V2_SESSIONS} <= set(PINNED_DIGESTS)


UPGRADES_FROM_V1 = tuple(f"v{v}->v{v + 1}" for v in range(1, SCHEMA_VERSION))


def state_down_to_v1(blob: dict) -> dict:
    for version in range(SCHEMA_VERSION, 1, -1):
        blob = downgrade_state_blob(blob, version)
    return blob


def step_down_to_v1(kind: str, payload: dict) -> dict:
    for version in range(SCHEMA_VERSION, 1, -1):
        payload = downgrade_step_payload(kind, payload, version)
    return payload


def fixture_records(fixture: dict) -> list[StepRecord]:
    """The live steps of a frozen session, loaded (upgraded) as a worker would."""
    return [
        StepRecord(
            seq=s["seq"],
            kind=StepKind(s["kind"]),
            payload=load_step_payload(s["kind"], s["payload"], s["schema_version"]).value,
            schema_version=s["schema_version"],
        )
        for s in fixture["steps"]
        if s["superseded_at"] is None
    ]


def as_dicts(messages: list[Message]) -> list[dict]:
    return [
        {
            "role": m.role,
            "content": m.content,
            "tool_calls": [c.to_dict() for c in m.tool_calls],
            "tool_call_id": m.tool_call_id,
            "name": m.name,
        }
        for m in messages
    ]


@pytest.mark.parametrize("name", V1_SESSIONS)
def test_v1_fixture_upgrades_and_reads_to_the_model_as_v1_did(name):
    fixture = read_fixture(name)
    assert {s["schema_version"] for s in fixture["steps"]} == {1}
    agent = demo_agents().get(fixture["session"]["agent"])
    messages = build_messages(agent.instructions, fixture_records(fixture))
    assert as_dicts(messages) == fixture["v1_messages"]


@pytest.mark.parametrize("name", V1_SESSIONS)
def test_v1_fixture_checkpoints_upgrade_keeping_every_value(name):
    for stored in read_fixture(name)["checkpoints"]:
        v1 = stored["state"]
        loaded = load_state(v1)
        assert loaded.stored_version == 1 and loaded.applied == UPGRADES_FROM_V1
        state = loaded.value
        assert [(p.title, p.status) for p in state.plan] == [
            (p["title"], p["status"]) for p in v1["plan"]
        ]
        assert [p.id for p in state.plan] == [f"p{n}" for n in range(1, len(v1["plan"]) + 1)]
        c = state.counters
        assert {
            "steps": c.steps,
            "model_calls": c.model_calls,
            "tool_calls": c.tool_calls,
            "tokens_in": c.tokens_in,
            "tokens_out": c.tokens_out,
            "cost": c.cost,
            "retries": c.retries,
        } == v1["counters"]
        assert state.final_answer == v1["final_answer"]
        assert state.memory_refs == v1["memory_refs"]
        pending = v1["pending_approval"]
        assert (state.pending_approval.call_id if state.pending_approval else None) == (
            pending["call_id"] if pending else None
        )
        assert state.to_dict()["schema_version"] == SCHEMA_VERSION
        assert state_down_to_v1(upgrade_state_blob(v1).value) == v1


@pytest.mark.parametrize("name", V1_SESSIONS)
def test_v1_fixture_steps_round_trip_exactly(name):
    for step in read_fixture(name)["steps"]:
        upgraded = load_step_payload(step["kind"], step["payload"], 1).value
        assert step_down_to_v1(step["kind"], upgraded) == step["payload"]


@pytest.mark.parametrize("name", V2_SESSIONS)
def test_v2_fixture_upgrades_and_reads_to_the_model_as_v2_did(name):
    fixture = read_fixture(name, 2)
    assert {s["schema_version"] for s in fixture["steps"]} == {2}
    agent = demo_agents().get(fixture["session"]["agent"])
    messages = build_messages(agent.instructions, fixture_records(fixture))
    assert as_dicts(messages) == fixture["v2_messages"]


@pytest.mark.parametrize("name", V2_SESSIONS)
def test_v2_fixture_checkpoints_upgrade_keeping_every_value(name):
    for stored in read_fixture(name, 2)["checkpoints"]:
        v2 = stored["state"]
        loaded = upgrade_state_blob(v2)
        assert loaded.stored_version == 2
        assert loaded.applied == tuple(f"v{v}->v{v + 1}" for v in range(2, SCHEMA_VERSION))
        # v3 only adds the agent's own state, which no v2 session had.
        assert loaded.value == {**v2, "schema_version": SCHEMA_VERSION, "agent_state": None}
        assert load_state(v2).value.to_dict() == loaded.value
        assert downgrade_state_blob(loaded.value, 3) == v2


@pytest.mark.parametrize("name", V2_SESSIONS)
def test_v2_fixture_steps_round_trip_exactly(name):
    for step in read_fixture(name, 2)["steps"]:
        upgraded = load_step_payload(step["kind"], step["payload"], 2).value
        assert upgraded == step["payload"]
        assert downgrade_step_payload(step["kind"], upgraded, 3) == step["payload"]


def test_v3_to_v2_drops_only_the_agent_state():
    patch = {"version": 2, "set": {"tickets": ["T-1"]}, "unset": []}
    result = {
        "call_id": "c",
        "name": "t",
        "status": "ok",
        "output": 1,
        "error": None,
        "attempts": 1,
        "agent_state": patch,
    }
    assert downgrade_step_payload("tool_result", result, 3) == {
        k: v for k, v in result.items() if k != "agent_state"
    }
    state = a_state(1)
    upgraded = upgrade_state_blob(state).value
    with_agent = {**upgraded, "agent_state": {"version": 2, "data": {"tickets": ["T-1"]}}}
    assert load_state(with_agent).value.agent_data == {"tickets": ["T-1"]}
    assert "agent_state" not in downgrade_state_blob(with_agent, 3)


@pytest.mark.parametrize(
    "agent_state",
    [{"version": 0, "data": {}}, {"version": 1}, {"version": "1", "data": {}}, [], {"data": {}}],
)
def test_a_v3_state_with_a_malformed_agent_state_is_refused(agent_state):
    blob = {**upgrade_state_blob(a_state(1)).value, "agent_state": agent_state}
    with pytest.raises(IncompatibleSchemaError, match="agent_state"):
        load_state(blob)


def test_v1_to_v2_gives_the_v2_shapes():
    """The released upgraders themselves (pure functions: they hold whatever comes later)."""
    payloads = {s["seq"]: s["payload"] for s in read_fixture("failed")["steps"]}
    user = step_v1_to_v2("user", payloads[1])
    assert user == {"content": [{"type": "text", "text": "what is 7/0, then save it as a note"}]}
    model = step_v1_to_v2("model", payloads[3])
    assert set(model) == {"content", "tool_calls", "usage", "model"}
    assert [c["id"] for c in model["tool_calls"]] == ["call_0_0", "call_0_1"]
    plan = step_v1_to_v2("tool_result", payloads[5])
    assert plan["status"] == "ok"
    assert plan["plan_update"][0] == {"title": "compute 7/0", "status": "in_progress"}
    failed = step_v1_to_v2("tool_result", payloads[7])
    assert failed["status"] == "error" and failed["error"] == "division by zero"
    assert "ok" not in failed
    assert step_v1_to_v2("error", payloads[8]) == payloads[8]
    state = state_v1_to_v2(read_fixture("failed")["checkpoints"][0]["state"])
    assert state["schema_version"] == 2
    assert state["plan"][0] == {"id": "p1", "title": "compute 7/0", "status": "in_progress"}
    assert state["counters"] == {
        "steps": 7,
        "model": {"calls": 1, "tokens_in": 25, "tokens_out": 30, "cost": 0.0},
        "tools": {"calls": 2, "retries": 0},
    }


def test_describe_step_reads_current_payloads():
    failed = load_step_payload("tool_result", read_fixture("failed")["steps"][6]["payload"], 1)
    assert describe_step("tool_result", failed.value) == "calculator: error: division by zero"


def test_upgraders_do_not_change_their_input():
    for name in V1_SESSIONS:
        fixture = read_fixture(name)
        before = copy.deepcopy(fixture)
        for step in fixture["steps"]:
            load_step_payload(step["kind"], step["payload"], 1)
        for checkpoint in fixture["checkpoints"]:
            load_state(checkpoint["state"])
        assert fixture == before


def a_state(version: int = 1) -> dict:
    return copy.deepcopy(read_fixture("completed")["checkpoints"][-1]["state"]) | {
        "schema_version": version
    }


@pytest.mark.parametrize("version", [99, SCHEMA_VERSION + 1])
def test_a_newer_state_is_refused_loudly(version):
    with pytest.raises(IncompatibleSchemaError, match="newer than this code") as exc:
        load_state(a_state(version))
    assert exc.value.found == version and exc.value.supported == SCHEMA_VERSION


@pytest.mark.parametrize("version", [None, 0, -1, "1", True, 1.0])
def test_a_state_without_a_valid_version_is_refused(version):
    with pytest.raises(IncompatibleSchemaError, match="no valid schema version"):
        load_state(a_state() | {"schema_version": version})


def test_a_newer_step_is_refused_and_says_where():
    with pytest.raises(IncompatibleSchemaError, match="newer than this code") as exc:
        load_step_payload("model", {"whatever": 1}, 99)
    located = exc.value.at("step seq 4 (model)")
    assert str(located).startswith("step seq 4 (model): model step payload was written by")
    assert located.where == "step seq 4 (model)" and located.found == 99


@pytest.mark.parametrize(
    ("kind", "payload", "version", "message"),
    [
        ("user", {"text": 12}, 1, "text must be a string"),
        ("tool_result", {"call_id": "c", "name": "n", "ok": "yes"}, 1, "ok must be true or false"),
        ("tool_result", {"call_id": "c", "name": "n"}, 1, "missing key 'ok'"),
        ("model", {"content": [{"type": "image", "url": "x"}], "tool_calls": []}, 2, "unknown"),
        ("model", {"content": [], "tool_calls": [{"id": "c"}]}, 2, "tool_calls"),
        ("tool_result", {"call_id": "c", "name": "n", "status": "maybe"}, 2, "status"),
        ("user", {"text": "a v1 payload stored as v2"}, 2, "content parts"),
        ("user", ["not", "an", "object"], 1, "not a JSON object"),
    ],
)
def test_a_step_payload_that_does_not_match_its_version_is_refused(kind, payload, version, message):
    with pytest.raises(IncompatibleSchemaError, match=message):
        load_step_payload(kind, payload, version)


def test_a_state_that_does_not_match_its_version_is_refused():
    broken = a_state()
    del broken["plan"]
    with pytest.raises(IncompatibleSchemaError, match="stored at schema version 1"):
        load_state(broken)
    with pytest.raises(IncompatibleSchemaError, match="not a JSON object"):
        load_state(["nope"])


def test_replan_keeps_ids_by_title_and_numbers_new_items_after_the_highest():
    plan = [PlanItem("p1", "a", "done"), PlanItem("p2", "b", "in_progress")]
    updated = replan(plan, [("b", "done"), ("c", "pending"), ("a", "done")])
    assert [(p.id, p.title, p.status) for p in updated] == [
        ("p2", "b", "done"),
        ("p3", "c", "pending"),
        ("p1", "a", "done"),
    ]
    assert [p.id for p in replan(updated, [("d", "pending")])] == ["p4"]
    assert [p.id for p in replan([], [("x", "pending"), ("x", "pending")])] == ["p1", "p2"]


# --- The property: an upgraded v1 history renders exactly as v1 rendered it ---------------


def render_v1(system_prompt: str, steps: list[tuple[str, dict]]) -> list[Message]:
    """v1's build_messages over v1 payloads, frozen as released (commit 56724ab)."""
    messages = [Message(role="system", content=system_prompt)] if system_prompt else []
    for kind, payload in steps:
        if kind == "user":
            messages.append(Message(role="user", content=payload.get("text", "")))
        elif kind == "model":
            messages.append(
                Message(
                    role="assistant",
                    content=payload.get("text"),
                    tool_calls=tuple(ToolCall(**c) for c in payload.get("tool_calls") or []),
                )
            )
        elif kind == "tool_result":
            content = json.dumps(
                {
                    "name": payload.get("name"),
                    "ok": payload.get("ok"),
                    "output": payload.get("output"),
                    "error": payload.get("error"),
                    "attempts": payload.get("attempts", 1),
                },
                sort_keys=True,
                default=str,
            )
            messages.append(
                Message(
                    role="tool",
                    content=content,
                    tool_call_id=payload.get("call_id"),
                    name=payload.get("name"),
                )
            )
        elif kind == "operator" and payload.get("action") == "instruction":
            messages.append(
                Message(role="user", content=f"[Operator instruction] {payload.get('text', '')}")
            )
    return messages


def answer_abandoned_calls(messages: list[Message]) -> list[Message]:
    """The rendering rule that came after v1: a tool call still without a result when the
    conversation moves on gets an explicit "not run" result right there."""
    out: list[Message] = []
    open_calls: dict[str, str] = {}
    for message in messages:
        if message.role == "tool":
            open_calls.pop(message.tool_call_id or "", None)
        else:
            for call_id, name in open_calls.items():
                content = json.dumps(
                    {
                        "name": name,
                        "ok": False,
                        "output": None,
                        "attempts": 0,
                        "error": "not run: the conversation moved on before this call ran",
                    },
                    sort_keys=True,
                )
                out.append(Message(role="tool", content=content, tool_call_id=call_id, name=name))
            open_calls = {}
        if message.role == "assistant":
            open_calls = {c.id: c.name for c in message.tool_calls}
        out.append(message)
    return out


text = st.text(max_size=30)
plan_statuses = st.sampled_from(["pending", "in_progress", "done"])
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**9), 10**9)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(text, children, max_size=3),
    max_leaves=10,
)
arguments = st.dictionaries(st.text(min_size=1, max_size=10), json_values, max_size=3)
tool_calls = st.lists(
    st.fixed_dictionaries(
        {
            "id": st.text(min_size=1, max_size=12),
            "name": st.text(min_size=1),
            "arguments": arguments,
        }
    ),
    max_size=3,
)
usage = st.fixed_dictionaries(
    {
        "input_tokens": st.integers(0, 10**6),
        "output_tokens": st.integers(0, 10**6),
        "cost": st.floats(0, 10, allow_nan=False),
    }
)
v1_steps = st.one_of(
    st.tuples(st.just("user"), st.fixed_dictionaries({"text": text})),
    st.tuples(
        st.just("model"),
        st.fixed_dictionaries(
            {
                "text": st.none() | text,
                "tool_calls": tool_calls,
                "usage": usage,
                "model": st.just("scripted:demo"),
            }
        ),
    ),
    st.tuples(
        st.just("tool_call"),
        st.fixed_dictionaries({"call_id": text, "name": text, "arguments": arguments}),
    ),
    st.tuples(
        st.just("tool_result"),
        st.fixed_dictionaries(
            {
                "call_id": text,
                "name": text,
                "ok": st.booleans(),
                "output": json_values,
                "error": st.none() | text,
                "attempts": st.integers(0, 5),
            },
            optional={
                "plan_update": st.lists(st.tuples(text, plan_statuses).map(list), max_size=3),
                "memory_added": st.lists(text, max_size=3),
            },
        ),
    ),
    st.tuples(
        st.just("operator"),
        st.one_of(
            st.fixed_dictionaries({"action": st.just("instruction"), "text": text, "actor": text}),
            st.fixed_dictionaries(
                {
                    "action": st.sampled_from(["approve", "reject"]),
                    "call_id": text,
                    "tool": text,
                    "actor": text,
                },
                optional={"reason": text},
            ),
        ),
    ),
    st.tuples(
        st.just("system"),
        st.fixed_dictionaries(
            {"event": st.sampled_from(["run_started", "already_answered"]), "worker": text}
        ),
    ),
    st.tuples(
        st.just("error"),
        st.fixed_dictionaries(
            {
                "where": text,
                "error": text,
                "attempts": st.integers(1, 4),
                "permanent": st.booleans(),
            }
        ),
    ),
)
v1_states = st.fixed_dictionaries(
    {
        "schema_version": st.just(1),
        "agent": st.fixed_dictionaries({"name": text, "version": text}),
        "turn": st.integers(0, 1000),
        "plan": st.lists(st.fixed_dictionaries({"title": text, "status": plan_statuses})),
        "memory_refs": st.lists(text, max_size=4),
        "counters": st.fixed_dictionaries(
            {
                "steps": st.integers(0, 10**6),
                "model_calls": st.integers(0, 10**6),
                "tool_calls": st.integers(0, 10**6),
                "tokens_in": st.integers(0, 10**9),
                "tokens_out": st.integers(0, 10**9),
                "cost": st.floats(0, 10**4, allow_nan=False),
                "retries": st.integers(0, 100),
            }
        ),
        "budgets": st.fixed_dictionaries(
            {
                "max_steps": st.integers(1, 10**5),
                "max_tokens": st.none() | st.integers(1, 10**9),
                "max_cost": st.none() | st.floats(0, 100, allow_nan=False),
            }
        ),
        "pending_approval": st.none()
        | st.fixed_dictionaries(
            {
                "call_id": text,
                "tool": text,
                "arguments": arguments,
                "model_seq": st.integers(1, 1000),
                "requested_at": st.none() | text,
            }
        ),
        "uncertain_calls": st.lists(text, max_size=3),
        "batch_cursor": st.none() | st.dictionaries(text, json_values, max_size=2),
        "final_answer": st.none() | text,
    }
)


@settings(max_examples=300, deadline=None)
@given(state=v1_states, steps=st.lists(v1_steps, max_size=12), prompt=text)
def test_upgraded_v1_sessions_render_identically_and_round_trip(state, steps, prompt):
    original = copy.deepcopy((state, steps))

    loaded = load_state(state)
    records = [
        StepRecord(seq=n, kind=StepKind(kind), payload=load_step_payload(kind, payload, 1).value)
        for n, (kind, payload) in enumerate(steps, start=1)
    ]
    # One rendering rule came after v1 and applies to every version alike: a tool call left
    # without a result gets an explicit "not run" answer where the conversation moves on.
    assert build_messages(prompt, records) == answer_abandoned_calls(render_v1(prompt, steps))

    # Nothing is lost: the upgrade goes back to exactly the v1 blobs.
    assert state_down_to_v1(loaded.value.to_dict()) == state
    for (kind, payload), record in zip(steps, records, strict=True):
        assert step_down_to_v1(kind, record.payload) == payload
    assert (state, steps) == original
