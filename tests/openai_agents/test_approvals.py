"""A run that stops on a tool call needing approval: its RunState in the session's
checkpoint (the SDK's own schema version; a newer one refused), the session waiting for a
person, the common approve / reject deciding it, and a worker's run (here in the test
process, as a job would run it) resuming the SDK run from the stored state."""

from __future__ import annotations

import asyncio
import json

import pytest
from agents import Runner
from agents.run_state import CURRENT_SCHEMA_VERSION

from sessions_app.models import AgentSession, AuditEvent, Checkpoint, Status, Step
from sessions_app.openai_agents.session import RunStateVersionError, check_run_state_version
from sessions_app.services.core import ActionError, session_approve, session_reject, session_start

from ..conftest import run_inline

pytestmark = pytest.mark.django_db(transaction=True)

AGENTS = ["acme_sdk:agents"]


def paused_refund(make_session, text="refund O-7 1250", sid="conv-refund", calls=1):
    from acme_sdk import run_config, support

    session = make_session(sid, agent="acme-sdk")
    result = asyncio.run(Runner.run(support, text, session=session, run_config=run_config))
    assert result.final_output is None and len(result.interruptions) == calls
    pending = asyncio.run(session.wait_for_approval(result))
    return session, pending


def head_state(row: AgentSession) -> dict:
    return Checkpoint.objects.filter(session=row, seq=row.head).latest("id").state


def test_a_paused_run_is_stored_in_the_checkpoint_and_waits(
    make_session, sdk_model, tmp_path, monkeypatch
):
    monkeypatch.setenv("ACME_SDK_LOG", str(tmp_path / "tools.log"))
    session, pending = paused_refund(make_session)
    assert pending == [
        {
            "call_id": pending[0]["call_id"],
            "tool": "refund",
            "arguments": {"order": "O-7", "amount": 1250},
        }
    ]
    row = AgentSession.objects.get(id=session.respawn_id)
    assert row.status == Status.WAITING_INPUT
    state = head_state(row)
    assert state["pending_approval"]["tool"] == "refund"
    assert state["pending_approval"]["arguments"] == {"order": "O-7", "amount": 1250}
    data = state["agent_state"]["data"]["openai_agents"]
    assert data["run_state"]["$schemaVersion"] == CURRENT_SCHEMA_VERSION
    assert data["run_state_version"] == CURRENT_SCHEMA_VERSION
    requested = Step.objects.get(session=row, payload__event="approval_requested")
    assert requested.payload["calls"][0]["tool"] == "refund"
    assert not (tmp_path / "tools.log").exists()  # nothing ran before the approval


def test_approved_in_the_common_service_then_a_worker_run_resumes(
    make_session, sdk_model, settings, users, tmp_path, monkeypatch
):
    settings.RESPAWN_AGENTS = AGENTS
    monkeypatch.setenv("ACME_SDK_LOG", str(tmp_path / "tools.log"))
    session, _ = paused_refund(make_session)
    row = session_approve(
        session_id=session.respawn_id, actor=users["operator"], reason="ok by policy"
    )
    assert row.status == Status.QUEUED
    row = run_inline(row)
    assert row.status == Status.COMPLETED, row.last_error
    assert row.final_answer == "Refund result: refunded 1250 on O-7"
    assert (tmp_path / "tools.log").read_text() == "refund O-7 1250\n"
    items = asyncio.run(make_session("conv-refund").get_items())
    assert [i.get("type", "message") for i in items] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    event = AuditEvent.objects.get(session=row, action="approve")
    assert event.actor_label == "olivia"


def test_rejected_the_tool_does_not_run_and_the_model_hears_why(
    make_session, sdk_model, settings, users, tmp_path, monkeypatch
):
    settings.RESPAWN_AGENTS = AGENTS
    monkeypatch.setenv("ACME_SDK_LOG", str(tmp_path / "tools.log"))
    session, _ = paused_refund(make_session)
    session_reject(session_id=session.respawn_id, actor=users["operator"], reason="too large")
    row = run_inline(AgentSession.objects.get(id=session.respawn_id))
    assert row.status == Status.COMPLETED, row.last_error
    assert not (tmp_path / "tools.log").exists()
    assert "too large" in row.final_answer
    tool_message = [m for m in sdk_model.bodies()[-1]["messages"] if m["role"] == "tool"]
    assert "A person rejected this tool call: too large" in tool_message[0]["content"]


def test_a_session_started_on_the_workers_pauses_and_resumes(sdk_model, settings, users):
    settings.RESPAWN_AGENTS = AGENTS
    row = run_inline(session_start(agent="acme-sdk", input="refund O-9 30"))
    assert row.status == Status.WAITING_INPUT, row.last_error
    assert head_state(row)["pending_approval"]["arguments"] == {"order": "O-9", "amount": 30}
    with pytest.raises(ActionError, match="waiting for an approval"):
        from sessions_app.services.core import session_resume

        session_resume(session_id=row.id, actor=users["operator"])
    session_approve(session_id=row.id, actor=users["operator"])
    row = run_inline(row)
    assert row.status == Status.COMPLETED, row.last_error
    assert row.final_answer == "Refund result: refunded 30 on O-9"
    # The user step the session started with is the conversation's first item, once.
    kinds = list(
        Step.objects.filter(session=row, superseded_at__isnull=True)
        .exclude(kind="system")
        .order_by("seq")
        .values_list("kind", flat=True)
    )
    assert kinds == ["user", "tool_call", "operator", "tool_result", "model"]
    # Each run recorded what its model calls used (the stub reports 12 in, 5 out a call);
    # the resumed run counts only its own call, not the one its RunState carried in.
    usage = Step.objects.filter(session=row, payload__event="sdk_usage").order_by("seq")
    assert [(s.payload["requests"], s.tokens_in, s.tokens_out) for s in usage] == [
        (1, 12, 5),
        (1, 12, 5),
    ]
    assert (row.tokens_in, row.tokens_out) == (24, 10)


def test_messages_sent_from_the_dashboard_continue_the_conversation(sdk_model, settings, users):
    from sessions_app.services.core import session_send_message

    settings.RESPAWN_AGENTS = AGENTS
    row = run_inline(session_start(agent="acme-sdk", input="hello"))
    assert row.final_answer == "You said: hello (turn 1, saw 2 messages)"
    session_send_message(session_id=row.id, content="again", actor=users["operator"])
    row = run_inline(row)
    assert row.final_answer == "You said: again (turn 2, saw 4 messages)"


def test_a_run_state_from_a_newer_sdk_is_refused(make_session, sdk_model, settings, users):
    settings.RESPAWN_AGENTS = AGENTS
    session, _ = paused_refund(make_session)
    row = AgentSession.objects.get(id=session.respawn_id)
    checkpoint = Checkpoint.objects.filter(session=row, seq=row.head).latest("id")
    major, minor = CURRENT_SCHEMA_VERSION.split(".")
    newer = f"{major}.{int(minor) + 1}"
    checkpoint.state["agent_state"]["data"]["openai_agents"]["run_state"]["$schemaVersion"] = newer
    checkpoint.save()
    session_approve(session_id=row.id, actor=users["operator"])
    row = run_inline(row)
    assert row.status == Status.FAILED
    assert f"schema version {newer}, newer than the {CURRENT_SCHEMA_VERSION}" in row.last_error
    with pytest.raises(RunStateVersionError, match="no schema version"):
        check_run_state_version({})
    assert check_run_state_version({"$schemaVersion": "1.0"}) == "1.0"


def test_wait_for_approval_refuses_a_run_that_did_not_stop(make_session, sdk_model):
    from acme_sdk import run_config, support

    session = make_session("conv-done")
    result = asyncio.run(Runner.run(support, "hi", session=session, run_config=run_config))
    with pytest.raises(ValueError, match="did not stop on a tool call that needs approval"):
        asyncio.run(session.wait_for_approval(result))
    with pytest.raises(TypeError, match="RunResult or a RunState"):
        asyncio.run(session.wait_for_approval("nope"))


def test_two_calls_waiting_in_one_turn_are_decided_one_by_one(
    make_session, sdk_model, settings, users, tmp_path, monkeypatch
):
    settings.RESPAWN_AGENTS = AGENTS
    monkeypatch.setenv("ACME_SDK_LOG", str(tmp_path / "tools.log"))
    session, pending = paused_refund(
        make_session, text="refunds O-1 10 O-2 20", sid="conv-two", calls=2
    )
    assert [p["arguments"]["order"] for p in pending] == ["O-1", "O-2"]
    row = AgentSession.objects.get(id=session.respawn_id)
    assert head_state(row)["pending_approval"]["arguments"]["order"] == "O-1"

    session_approve(session_id=row.id, actor=users["operator"])
    row = run_inline(row)
    # The first is decided; the session waits for the second, the run not resumed yet.
    assert row.status == Status.WAITING_INPUT, row.last_error
    assert head_state(row)["pending_approval"]["arguments"]["order"] == "O-2"
    assert not (tmp_path / "tools.log").exists()

    session_reject(session_id=row.id, actor=users["operator"], reason="duplicate")
    row = run_inline(row)
    assert row.status == Status.COMPLETED, row.last_error
    assert (tmp_path / "tools.log").read_text() == "refund O-1 10\n"
    assert row.final_answer == (
        "Refunds: refunded 10 on O-1; A person rejected this tool call: duplicate"
    )


def test_a_resumed_run_that_stored_the_tool_output_before_dying_does_not_run_it_again(
    make_session, sdk_model, settings, users, tmp_path, monkeypatch
):
    settings.RESPAWN_AGENTS = AGENTS
    monkeypatch.setenv("ACME_SDK_LOG", str(tmp_path / "tools.log"))
    session, pending = paused_refund(make_session, sid="conv-died")
    row = session_approve(session_id=session.respawn_id, actor=users["operator"])
    # What the resumed run stored before its worker died: the approved call's output.
    Step.objects.create(
        session=row,
        seq=row.last_seq + 1,
        kind="tool_result",
        payload={
            "call_id": pending[0]["call_id"],
            "name": "refund",
            "status": "ok",
            "output": "refunded 1250 on O-7",
            "item": {
                "type": "function_call_output",
                "call_id": pending[0]["call_id"],
                "output": "refunded 1250 on O-7",
            },
        },
    )
    AgentSession.objects.filter(id=row.id).update(last_seq=row.last_seq + 1)
    row = run_inline(row)
    assert row.status == Status.COMPLETED, row.last_error
    assert row.final_answer == "Refund result: refunded 1250 on O-7"
    assert not (tmp_path / "tools.log").exists()


def test_checkpoints_name_the_version_that_ran_so_an_older_worker_refuses(
    sdk_model, settings, users
):
    from agent_runtime.loop import Outcome, run_session
    from sessions_app.runtime import agent_registry, run_config
    from sessions_app.services.core import session_send_message
    from sessions_app.store import DjangoEffects, session_store

    settings.RESPAWN_AGENTS = AGENTS
    row = run_inline(session_start(agent="acme-sdk", input="hello"))
    assert head_state(row)["agent"]["version"] == "1"
    settings.RESPAWN_AGENTS = ["acme_sdk:agents_v2"]
    session_send_message(session_id=row.id, content="again", actor=users["operator"])
    row = run_inline(row)
    assert row.status == Status.COMPLETED and head_state(row)["agent"]["version"] == "2"
    settings.RESPAWN_AGENTS = AGENTS
    session_send_message(session_id=row.id, content="once more", actor=users["operator"])
    result = run_session(
        str(row.id),
        store=session_store(),
        agents=agent_registry(),
        effects=DjangoEffects(),
        config=run_config(),
    )
    assert result.outcome == Outcome.INCOMPATIBLE
    assert "already ran on version 2" in result.error


def test_a_run_started_from_async_code_runs_its_loop_on_a_thread(sdk_model, settings, monkeypatch):
    settings.RESPAWN_AGENTS = AGENTS
    # The ORM calls of run_inline itself, made from a coroutine here, are the test's own.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    session = session_start(agent="acme-sdk", input="hello")

    async def from_async_code():
        from django.db import connections

        try:
            return run_inline(session)
        finally:
            connections.close_all()  # the connection this context opened

    row = asyncio.run(from_async_code())
    assert row.status == Status.COMPLETED, row.last_error
    assert row.final_answer == "You said: hello (turn 1, saw 2 messages)"


def test_an_operators_instruction_and_correction_reach_the_sdk_model(sdk_model, settings, users):
    from sessions_app.services.core import session_add_instruction, session_correct_result

    settings.RESPAWN_AGENTS = AGENTS
    row = run_inline(session_start(agent="acme-sdk", input="loop 1"))
    assert row.final_answer == "Worked 1 steps."
    result = Step.objects.get(session=row, kind="tool_result")
    session_correct_result(
        session_id=row.id,
        result_seq=result.seq,
        output="step 1 redone",
        note="checked",
        actor=users["operator"],
    )
    row = run_inline(row)
    assert row.status == Status.COMPLETED, row.last_error
    sent = sdk_model.bodies()[-1]["messages"]
    tool = [m for m in sent if m["role"] == "tool"]
    assert json.loads(tool[0]["content"]) == {
        "output": "step 1 redone",
        "corrected_by_operator": "olivia",
        "operator_note": "checked",
    }
    assert sent[-1]["content"].startswith("[Operator correction] The result of tool call")

    session_add_instruction(session_id=row.id, text="answer in French", actor=users["operator"])
    row = run_inline(row)
    assert row.status == Status.COMPLETED, row.last_error
    assert sdk_model.bodies()[-1]["messages"][-1] == {
        "role": "user",
        "content": "[Operator instruction] answer in French",
    }
    assert row.final_answer.startswith("You said: [Operator instruction] answer in French")


def test_a_run_paused_by_sdk_schema_1_21_still_resumes(make_session, sdk_model, settings, users):
    """A frozen pause (tests/fixtures/openai_agents, recorded with openai-agents 0.24.0,
    RunState schema 1.21): an SDK upgrade must still resume what the old one stored."""
    from pathlib import Path

    frozen = json.loads(
        (Path(__file__).parents[1] / "fixtures/openai_agents/paused_refund_1.21.json").read_text()
    )
    settings.RESPAWN_AGENTS = AGENTS
    session = make_session("conv-frozen", agent="acme-sdk")
    asyncio.run(session.add_items(frozen["items"]))

    async def pause():
        from acme_sdk import support
        from agents import RunState

        await session.wait_for_approval(await RunState.from_json(support, frozen["run_state"]))

    asyncio.run(pause())
    row = session_approve(session_id=session.respawn_id, actor=users["operator"])
    row = run_inline(row)
    assert row.status == Status.COMPLETED, row.last_error
    assert row.final_answer == "Refund result: refunded 1250 on O-7"


def test_a_program_cannot_write_past_a_pending_approval(make_session, sdk_model):
    from sessions_app.openai_agents.session import SessionBusy

    session, pending = paused_refund(make_session, sid="conv-pending")
    before = Step.objects.filter(session_id=session.respawn_id).count()
    with pytest.raises(SessionBusy, match=f"decision on tool call {pending[0]['call_id']}"):
        asyncio.run(session.add_items([{"role": "user", "content": "never mind"}]))
    with pytest.raises(SessionBusy):
        asyncio.run(session.pop_item())
    assert Step.objects.filter(session_id=session.respawn_id).count() == before


def test_a_program_resuming_a_paused_run_itself_is_refused_before_the_tool_runs(
    make_session, sdk_model, tmp_path, monkeypatch
):
    """The run belongs to Respawn once stored: a program that approves it itself and
    resumes it with the session's hooks is refused before the approved tool runs (the SDK
    calls no session method before it runs the approved tools of a resumed RunState, so
    the hooks' first write is the first point Respawn sees)."""
    from acme_sdk import run_config, support

    from sessions_app.openai_agents.session import SessionBusy

    monkeypatch.setenv("ACME_SDK_LOG", str(tmp_path / "tools.log"))
    session = make_session("conv-own-resume", agent="acme-sdk")
    result = asyncio.run(
        Runner.run(support, "refund O-7 1250", session=session, run_config=run_config)
    )
    asyncio.run(session.wait_for_approval(result))
    before = Step.objects.filter(session_id=session.respawn_id).count()
    state = result.to_state()
    for item in state.get_interruptions():
        state.approve(item)
    with pytest.raises(Exception) as raised:
        asyncio.run(
            Runner.run(
                support, state, session=session, run_config=run_config, hooks=session.trace_hooks()
            )
        )
    chain, error = [], raised.value
    while error is not None:
        chain.append(error)
        error = error.__cause__ or error.__context__
    assert any(isinstance(e, SessionBusy) for e in chain), chain
    assert not (tmp_path / "tools.log").exists()  # the refund never ran
    assert Step.objects.filter(session_id=session.respawn_id).count() == before
