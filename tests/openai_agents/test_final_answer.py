"""The session's final answer is the run's final output, also when a tool's output is it
(tool_use_behavior "stop_on_first_tool" or StopAtTools): in a program's run and in a
worker's."""

from __future__ import annotations

import asyncio

import pytest
from agents import Runner

from sessions_app.models import AgentSession, Status
from sessions_app.services.core import session_start

from ..conftest import run_inline

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    "behaviour", ["stop_on_first_tool", {"stop_at_tool_names": ["work"]}], ids=["first", "named"]
)
def test_a_programs_run_answered_by_a_tool(make_session, sdk_model, behaviour):
    from acme_sdk import run_config, support

    agent = support.clone(tool_use_behavior=behaviour)
    session = make_session("final-from-tool")
    result = asyncio.run(
        Runner.run(agent, "hello", session=session, run_config=run_config)
    )  # a first turn answered by the model
    assert AgentSession.objects.get(id=session.respawn_id).final_answer == result.final_output
    result = asyncio.run(Runner.run(agent, "loop 1", session=session, run_config=run_config))
    assert result.final_output == "step 1 done"
    row = AgentSession.objects.get(id=session.respawn_id)
    assert row.final_answer == "step 1 done"
    assert row.status == Status.COMPLETED


def test_a_workers_run_answered_by_a_tool(sdk_model, settings):
    settings.RESPAWN_AGENTS = ["acme_sdk:agents_tool_answers"]
    row = run_inline(session_start(agent="acme-sdk-tool", input="loop 1"))
    assert row.status == Status.COMPLETED, row.last_error
    assert row.final_answer == "step 1 done"
