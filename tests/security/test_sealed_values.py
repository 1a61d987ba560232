"""What a run reads back is never altered on its way to storage (sessions_app.sealing): any
JSON value, secrets, NULs, lone surrogates and jsonb-unfriendly floats included, comes back
equal through the built-in loop's store, an admin-style ORM write, RespawnSession and
RespawnSaver; the secrets in it are encrypted at rest and masked wherever people look; a
key rotation re-encrypts them and an unknown key is a clear error."""

from __future__ import annotations

import asyncio
import uuid
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agent_runtime.state import (
    NewCheckpoint,
    NewStep,
    SessionState,
    StepKind,
    model_payload,
    user_payload,
)
from sessions_app.models import AgentSession, Checkpoint, GraphBlob, Step
from sessions_app.sealing import Sealed, SealError, exact, keep_secrets
from sessions_app.store import session_store, writes

pytestmark = pytest.mark.django_db(transaction=True)

OPENAI = "sk-proj-FAKEfakeFAKEfake0123456789abcdefgh"
GITHUB = "ghp_" + "a1B2" * 9
PEM = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBg\n-----END PRIVATE KEY-----"
AWS = "AKIAIOSFODNN7EXAMPLE wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
AWKWARD = [OPENAI, GITHUB, PEM, AWS, "[REDACTED:x]", "\x00", "\ud800", "$sealed", "\\u0000", "e+1"]

texts = st.one_of(
    st.text(max_size=12),
    st.sampled_from(AWKWARD),
    st.builds(
        lambda a, s, b: f"{a} {s} {b}",
        st.text(max_size=4),
        st.sampled_from(AWKWARD),
        st.text(max_size=4),
    ),
)
keys = st.one_of(
    st.text(max_size=8), st.sampled_from(["password", "api_key", "$sealed", "$view", "k\x00"])
)


def _json(integers: st.SearchStrategy[int]) -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        integers,
        st.floats(allow_nan=False, allow_infinity=False),
        st.sampled_from([1e23, -1.5e300, 1e16, 5e-324]),
        texts,
    )
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)
        ),
        max_leaves=12,
    )


json_values = _json(st.integers(min_value=-(2**70), max_value=2**70))
# Integers just outside 64 bits and far beyond: a fast JSON decoder turns them into floats.
WIDE = [-(2**63) - 1, 2**64, 10**30, {"n": [-(10**40)]}]


def wide_integers(test):
    for value in WIDE:
        test = example(value=value)(test)
    return test


# LangGraph's serializer (msgpack) refuses integers beyond 64 bits, whatever the saver.
graph_values = _json(st.integers(min_value=-(2**63), max_value=2**64 - 1))
examples = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _run(coro):
    return asyncio.run(coro)


@contextmanager
def _adapter(make):
    """An adapter closed when done (each holds a connection on a thread of its own)."""
    made = make()
    try:
        yield made
    finally:
        made.close()


def _saver():
    from sessions_app.langgraph.saver import RespawnSaver

    return _adapter(RespawnSaver)


def _new_session() -> AgentSession:
    session = AgentSession.objects.create(agent="echo", last_seq=1, step_count=1)
    Step.objects.create(session=session, seq=1, kind="user", payload=user_payload("hi"))
    return session


@examples
@wide_integers
@given(value=json_values)
def test_the_built_in_loops_store_gives_back_tool_arguments_results_and_state_exactly(value):
    session = _new_session()
    store = session_store()
    lease = store.claim(str(session.id), "owner", ttl=30)
    call = model_payload(None, [{"id": "c1", "name": "t", "arguments": {"v": value}}], {}, "m")
    result = {"call_id": "c1", "name": "t", "status": "ok", "output": value}
    state = SessionState(agent_name="echo", agent_version="1")
    state.agent_state = {"version": 1, "data": {"v": value}}
    store.append(
        lease,
        [
            NewStep(kind=StepKind.MODEL, payload=call),
            NewStep(kind=StepKind.TOOL_RESULT, payload=result),
        ],
        checkpoint=NewCheckpoint(state=state),
    )
    head = store.load_head(str(session.id))
    model, tool = head.history[-2:]
    assert model.payload["tool_calls"][0]["arguments"] == {"v": value}
    assert tool.payload["output"] == value
    assert head.checkpoint.state.agent_state["data"] == {"v": value}


@examples
@wide_integers
@given(value=json_values)
def test_an_orm_write_gives_back_the_value_and_people_see_it_masked(value):
    session = _new_session()
    payload = {"call_id": "c1", "name": "t", "status": "ok", "output": value}
    writes.add_step(session, "tool_result", payload)
    step = Step.objects.get(session=session, seq=2)
    assert exact(step.payload) == payload
    # What a page or the API reads holds no secret.
    shown = repr(dict(step.payload) if isinstance(step.payload, dict) else step.payload)
    for secret in (OPENAI, GITHUB, "MIIEvQIBADANBg"):
        assert secret not in shown
    assert session_store().load_history(str(session.id))[-1].payload == payload


@examples
@wide_integers
@given(value=json_values)
def test_respawn_session_items_come_back_exactly(value):
    from sessions_app.openai_agents.session import RespawnSession

    items = [
        {"role": "user", "content": "hello", "extra": value},
        {"type": "function_call", "call_id": "c1", "name": "t", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": str(value)},
    ]
    name = f"sealed-{uuid.uuid4().hex}"
    with _adapter(lambda: RespawnSession(name)) as session:
        _run(session.add_items(items))
    with _adapter(lambda: RespawnSession(name)) as session:
        assert _run(session.get_items()) == items
        assert _run(session.pop_item()) == items[-1]


@examples
@given(value=graph_values)
def test_respawn_saver_gives_back_what_langgraphs_reference_saver_does(value):
    """Values go through the graph's serializer (LangGraph's: it turns a lone surrogate into
    "?", refuses integers beyond 64 bits, whatever the saver);
    what it wrote comes back as LangGraph's in-memory saver gives it back."""
    from langgraph.checkpoint.base import empty_checkpoint, get_serializable_checkpoint_metadata
    from langgraph.checkpoint.memory import InMemorySaver

    config = {"configurable": {"thread_id": f"sealed-{uuid.uuid4().hex}", "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"v": value, "s": value if isinstance(value, str) else "x"}
    checkpoint["channel_versions"] = {"v": "1", "s": "1"}
    metadata = {"source": "input", "step": -1, "note": value}

    def through(saver):
        saved = saver.put(config, checkpoint, metadata, {"v": "1", "s": "1"})
        saver.put_writes(saved, [("v", value)], task_id="task-1")
        return saved

    reference = InMemorySaver()
    expected = reference.get_tuple(through(reference))
    with _saver() as saver:
        saved = through(saver)
    with _saver() as saver:
        got = saver.get_tuple(saved)
    assert got.checkpoint["channel_values"] == expected.checkpoint["channel_values"]
    # Metadata is JSON, kept exactly as LangGraph's metadata function gives it (the
    # in-memory saver passes it through the serializer too).
    assert got.metadata == get_serializable_checkpoint_metadata(config, metadata)
    assert got.pending_writes == expected.pending_writes


def test_secrets_are_encrypted_at_rest_and_masked_on_the_page_and_api(client, users):
    session = _new_session()
    payload = {"call_id": "c1", "name": "deploy", "status": "ok", "output": {"key": OPENAI}}
    writes.add_step(session, "tool_result", payload)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT payload::text FROM sessions_app_step WHERE session_id = %s AND seq = 2",
            [session.id],
        )
        raw = cursor.fetchone()[0]
    assert OPENAI not in raw and "$sealed" in raw and "[REDACTED:" in raw
    client.force_login(users["operator"])
    page = client.get(f"/sessions/{session.id}/").content.decode()
    api = client.get(f"/api/sessions/{session.id}/steps").content.decode()
    for shown in (page, api):
        assert OPENAI not in shown and "$sealed" not in shown


def test_a_graph_channel_with_a_secret_is_stored_encrypted():
    from langgraph.checkpoint.base import empty_checkpoint

    config = {"configurable": {"thread_id": "sealed-blob", "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"messages": [f"use {OPENAI}"], "key": OPENAI}
    checkpoint["channel_versions"] = {"messages": "1", "key": "1"}
    with _saver() as saver:
        saved = saver.put(
            config, checkpoint, {"source": "input", "step": -1}, {"messages": "1", "key": "1"}
        )
    blobs = list(GraphBlob.objects.values_list("type", "blob"))
    assert blobs and all(kind.startswith("sealed:") for kind, _ in blobs)
    assert all(OPENAI.encode() not in bytes(blob) for _, blob in blobs)
    with connection.cursor() as cursor:
        cursor.execute("SELECT body::text FROM sessions_app_graphcheckpoint")
        assert all(OPENAI not in body for (body,) in cursor.fetchall())
    with _saver() as saver:
        assert saver.get_tuple(saved).checkpoint["channel_values"] == checkpoint["channel_values"]


def test_an_edit_on_the_masked_view_keeps_the_secrets_left_as_shown():
    session = _new_session()
    writes.add_step(
        session,
        "tool_result",
        {"call_id": "c1", "name": "t", "status": "ok", "output": {"key": OPENAI, "n": 1}},
    )
    shown = Step.objects.get(session=session, seq=2).payload
    assert isinstance(shown, Sealed) and shown["output"]["key"].startswith("[REDACTED:")
    edited = {**shown, "output": {**shown["output"], "n": 2}}
    assert keep_secrets(edited, shown)["output"] == {"key": OPENAI, "n": 2}
    # A secret the person replaced is theirs to replace.
    edited["output"]["key"] = "gone"
    assert keep_secrets(edited, shown)["output"]["key"] == "gone"


def test_a_fork_or_rollback_copy_of_a_masked_view_keeps_the_exact_value():
    session = _new_session()
    state = {"agent": {"name": "echo", "version": "1"}, "secret": OPENAI, "nul": "a\x00b"}
    writes.add_checkpoint(session, state, seq=1)
    view = Checkpoint.objects.get(session=session).state
    assert view["secret"] != OPENAI
    # Written back as read (what a copy does): the same envelope, the secret intact.
    Checkpoint.objects.filter(session=session).update(state=view)
    assert exact(Checkpoint.objects.get(session=session).state) == state


def test_rotation_re_encrypts_every_sealed_value_and_an_unknown_key_is_named(settings):
    from django.core.management import call_command
    from langgraph.checkpoint.base import empty_checkpoint

    settings.RESPAWN_SEAL_KEYS = ["old-key-" + "x" * 40]
    session = _new_session()
    payload = {"call_id": "c1", "name": "t", "status": "ok", "output": OPENAI}
    writes.add_step(session, "tool_result", payload)
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"key": [OPENAI]}
    checkpoint["channel_versions"] = {"key": "1"}
    config = {"configurable": {"thread_id": "rotate", "checkpoint_ns": ""}}
    with _saver() as saver:
        saved = saver.put(config, checkpoint, {"source": "input", "step": -1}, {"key": "1"})
    settings.RESPAWN_SEAL_KEYS = ["new-key-" + "y" * 40, "old-key-" + "x" * 40]
    call_command("reseal")
    settings.RESPAWN_SEAL_KEYS = ["new-key-" + "y" * 40]
    assert exact(Step.objects.get(session=session, seq=2).payload) == payload
    with _saver() as saver:
        assert saver.get_tuple(saved).checkpoint["channel_values"] == {"key": [OPENAI]}
    settings.RESPAWN_SEAL_KEYS = ["another-key-" + "z" * 40]
    with pytest.raises(SealError, match="not among RESPAWN_SEAL_KEYS"):
        exact(Step.objects.get(session=session, seq=2).payload)


def test_an_admin_edit_of_a_masked_payload_keeps_the_secret_and_a_correction_too(users):
    from sessions_app.services.core import session_correct_result
    from sessions_app.services.records import step_edit_payload

    session = _new_session()
    payload = {"call_id": "c1", "name": "t", "status": "ok", "output": {"key": OPENAI, "n": 1}}
    writes.add_step(session, "tool_result", payload)
    session.save()  # the caller of add_step saves the counted session
    step = Step.objects.get(session=session, seq=2)
    shown = step.payload
    # Saved as shown: nothing changes.
    step_edit_payload(step_id=step.pk, payload=dict(shown), actor=users["operator"])
    assert exact(Step.objects.get(pk=step.pk).payload) == payload
    edited = {**shown, "output": {**shown["output"], "n": 2}}
    step_edit_payload(step_id=step.pk, payload=edited, actor=users["operator"])
    assert exact(Step.objects.get(pk=step.pk).payload)["output"] == {"key": OPENAI, "n": 2}
    # A correction typed over the masked output keeps what was left as shown.
    AgentSession.objects.filter(id=session.id).update(status="paused")
    session_correct_result(
        session_id=session.id,
        result_seq=2,
        output={**shown["output"], "n": 3},
        actor=users["operator"],
    )
    correction = Step.objects.filter(session=session, kind="operator").latest("seq")
    assert exact(correction.payload)["output"] == {"key": OPENAI, "n": 3}
