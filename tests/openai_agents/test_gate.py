"""What an SDK agent's deploy gate reads from a session: the calls it still has to run
(sessions_app.openai_agents.gate), and what the agents page shows of the agent."""

from __future__ import annotations

from acme_sdk import run_config, support, support_without_refund

from agent_runtime.state import SessionStatus, StepKind, StepRecord
from agent_runtime.store import SessionHead
from sessions_app.openai_agents.gate import describe, session_problems
from sessions_app.openai_agents.session import STATE_KEY


def _head(*steps: StepRecord) -> SessionHead:
    return SessionHead(
        session_id="s1",
        agent_name="acme-sdk",
        status=SessionStatus.QUEUED,
        head_seq=0,
        last_seq=len(steps),
        checkpoint=None,
        history=list(steps),
    )


def _call(seq: int, call_id: str, name: str) -> StepRecord:
    payload = {"call_id": call_id, "name": name, "arguments": {}}
    return StepRecord(seq=seq, kind=StepKind.TOOL_CALL, payload=payload)


def test_a_call_without_its_output_names_a_tool_that_is_gone():
    answered = StepRecord(
        seq=3, kind=StepKind.TOOL_RESULT, payload={"call_id": "c1", "output": "ok"}
    )
    head = _head(_call(2, "c1", "refund"), answered, _call(4, "c2", "refund"))
    assert session_problems(support, head, state_key=STATE_KEY) == []
    [problem] = session_problems(support_without_refund, head, state_key=STATE_KEY)
    assert problem.where == "uncertain tool call at seq 4 (refund)"
    assert "(SDK agent 'acme-support') has no tool 'refund' (its tools: work)" in problem.error


def test_describe_gives_the_model_instructions_and_tools_with_approval():
    described = describe(support, run_config)
    assert (described.kind, described.model) == ("OpenAI Agents SDK agent", "acme-model")
    assert described.instructions == "You help Acme's customers."
    tools = {t.name: t for t in described.tools}
    assert tools["refund"].needs_approval and not tools["work"].needs_approval
    assert tools["refund"].parameters["required"] == ["order", "amount"]
