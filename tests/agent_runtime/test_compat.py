"""The deploy gate's engine half for agents whose turn loop is a foreign runner: the runner
checks its own sessions (CheckedRunner), Respawn's tool-call check does not apply."""

from __future__ import annotations

from agent_runtime.agents import Agent, AgentRegistry
from agent_runtime.compat import Problem, session_problems
from agent_runtime.runners import (
    CheckedRunner,
    DescribedRunner,
    RunContext,
    RunnerDescription,
    RunnerResult,
)
from agent_runtime.store import InMemoryStore, SessionHead


class PlainRunner:
    def run(self, context: RunContext) -> RunnerResult:
        return RunnerResult.completed("done")


class CheckingRunner(PlainRunner):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def describe(self) -> RunnerDescription:
        return RunnerDescription(kind="test loop", nodes=("a",))

    def session_problems(self, head: SessionHead) -> list[Problem]:
        self.seen.append(head.session_id)
        return [Problem("interrupt at seq 1 (b)", "node 'b' is gone")]


def _head(agent: str) -> SessionHead:
    store = InMemoryStore()
    store.create_session("s1", agent, "hello", agent_version="1")
    return store.load_head("s1")


def test_a_checked_runner_names_the_problems_of_its_sessions():
    runner = CheckingRunner()
    assert isinstance(runner, CheckedRunner) and isinstance(runner, DescribedRunner)
    agents = AgentRegistry([Agent(name="graph", runner=runner)])
    assert session_problems(_head("graph"), agents) == [
        Problem("interrupt at seq 1 (b)", "node 'b' is gone")
    ]
    assert runner.seen == ["s1"]


def test_a_runner_that_does_not_check_passes_and_is_not_described():
    runner = PlainRunner()
    assert not isinstance(runner, CheckedRunner) and not isinstance(runner, DescribedRunner)
    agents = AgentRegistry([Agent(name="graph", runner=runner)])
    assert session_problems(_head("graph"), agents) == []
