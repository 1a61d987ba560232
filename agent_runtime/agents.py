"""Agents: a name, a version, a model, instructions, tools, limits, and state of its own.

    from agent_runtime import Agent, AgentState, Limits, tool

    support = Agent(
        name="support",
        version="3",
        model="openai:gpt-4o-mini",
        instructions="You answer questions about our product from its documentation.",
        tools=[search_docs, create_ticket],
        limits=Limits(max_steps=60, max_cost=0.50),
        state=AgentState(version=2, initial=lambda: {"tickets": []},
                         upgraders={1: tickets_v1_to_v2}),
        compatible_since="2",
    )

An Agent is checked when it is built: a bad name, a tool that is not a `@tool`, two tools
with one name or a limit out of range raise `AgentConfigError` naming the agent and the
problem. Agents are found by `agent_runtime.discovery` from `module:attribute` paths and
the `respawn.agents` entry-point group; nothing here imports Django.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .tools import Tool, ToolRegistry

if TYPE_CHECKING:
    from .runners import Runner
    from .state import SessionState

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
MAX_VERSION_CHARS = 50

Instructions = str | Callable[["SessionState"], str]
StateUpgrader = Callable[[dict[str, Any]], dict[str, Any]]


class AgentConfigError(ValueError):
    """An agent definition that cannot work; the message names the agent and the problem."""


class AgentStateError(Exception):
    """A session's agent state that this agent's code cannot load (a version newer than
    its own, a version it has no upgrader from, an upgrader that failed)."""


@dataclass(frozen=True)
class Limits:
    """What one session of the agent may use. Steps count every step of the trace; tokens
    are input plus output tokens of every model call; cost is what the calls cost (the
    provider's figure, else the price table's: agent_runtime.pricing); seconds are wall
    time from the session's start. A session that reaches a limit is paused with the
    reason before its next model call; an operator can raise the limit and resume it.
    A session started through the API may set its own limits (`budgets`)."""

    max_steps: int = 200
    max_tokens: int | None = None
    max_cost: float | None = None
    max_seconds: float | None = None
    # Tool calls of one model turn that may run at once as branch jobs on several workers
    # (1: one after the other in the session's own run).
    max_parallel_tools: int = 1
    # Retries of a failing model call (None: the deployment's RESPAWN_MODEL_RETRIES).
    max_model_retries: int | None = None

    def problems(self) -> list[str]:
        out = []
        if not _positive_int(self.max_steps):
            out.append(f"max_steps must be a positive integer, got {self.max_steps!r}")
        if self.max_tokens is not None and not _positive_int(self.max_tokens):
            out.append(f"max_tokens must be a positive integer or None, got {self.max_tokens!r}")
        if self.max_cost is not None and not (
            isinstance(self.max_cost, int | float)
            and not isinstance(self.max_cost, bool)
            and self.max_cost > 0
        ):
            out.append(f"max_cost must be a positive number or None, got {self.max_cost!r}")
        if self.max_seconds is not None and not (
            isinstance(self.max_seconds, int | float)
            and not isinstance(self.max_seconds, bool)
            and self.max_seconds > 0
        ):
            out.append(f"max_seconds must be a positive number or None, got {self.max_seconds!r}")
        if not _positive_int(self.max_parallel_tools):
            out.append(
                f"max_parallel_tools must be a positive integer, got {self.max_parallel_tools!r}"
            )
        if self.max_model_retries is not None and not (
            isinstance(self.max_model_retries, int)
            and not isinstance(self.max_model_retries, bool)
            and self.max_model_retries >= 0
        ):
            out.append(
                f"max_model_retries must be an integer >= 0 or None, got {self.max_model_retries!r}"
            )
        return out


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclass(frozen=True)
class AgentState:
    """The agent's own state, kept in every checkpoint beside the engine's: a JSON object
    with a version number of the agent's choosing and the upgraders from each older
    version to the next (`{1: v1_to_v2, 2: v2_to_v3}`), pure functions of the old dict.

    Tools read and change it through `ctx.state`; the changed top-level keys are recorded
    with the call's result. A session whose stored agent state is newer than the code, or
    at a version with no upgrader, is refused and marked incompatible, never half-read.
    A released upgrader is never edited: it is what upgraded the sessions already out there.
    """

    version: int = 1
    initial: Callable[[], dict[str, Any]] | None = None
    upgraders: Mapping[int, StateUpgrader] = field(default_factory=dict)

    def fresh(self) -> dict[str, Any]:
        """The state a new session starts with (a JSON object)."""
        data = self.initial() if self.initial is not None else {}
        if not isinstance(data, dict):
            raise AgentStateError(
                f"the initial agent state must be a dict, got {type(data).__name__}"
            )
        return data

    def problems(self) -> list[str]:
        out = []
        if not _positive_int(self.version):
            out.append(f"state version must be a positive integer, got {self.version!r}")
        if self.initial is not None and not callable(self.initial):
            out.append("state initial must be a function returning the new state (a dict)")
        for key, upgrader in dict(self.upgraders).items():
            if not _positive_int(key) or (_positive_int(self.version) and key >= self.version):
                out.append(
                    f"state upgrader key {key!r} must be a version below {self.version!r} "
                    "(the version it upgrades from)"
                )
            if not callable(upgrader):
                out.append(f"state upgrader from version {key!r} is not a function")
        return out

    def load(self, stored: dict[str, Any] | None) -> tuple[dict[str, Any], tuple[str, ...]]:
        """The stored agent state ({"version", "data"}, or None for a session that has
        none yet) at this code's version, with the upgraders applied ("1->2", ...)."""
        if stored is None:
            return {"version": self.version, "data": self.fresh()}, ()
        version, data = stored["version"], stored["data"]
        if version > self.version:
            raise AgentStateError(
                f"the agent state was written at version {version}, newer than this code's "
                f"({self.version}); deploy the newer agent code"
            )
        applied = []
        while version < self.version:
            upgrader = self.upgraders.get(version)
            if upgrader is None:
                have = ", ".join(str(k) for k in sorted(self.upgraders)) or "none"
                raise AgentStateError(
                    f"no upgrader from agent state version {version} to {version + 1} "
                    f"(upgraders from versions: {have})"
                )
            try:
                data = upgrader(copy.deepcopy(data))
            except Exception as exc:
                raise AgentStateError(
                    f"the agent state upgrader from version {version} raised "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            if not isinstance(data, dict):
                raise AgentStateError(
                    f"the agent state upgrader from version {version} returned "
                    f"{type(data).__name__}, not a dict"
                )
            applied.append(f"{version}->{version + 1}")
            version += 1
        try:
            json.dumps(data)
        except (TypeError, ValueError) as exc:
            raise AgentStateError(f"the agent state is not JSON: {exc}") from exc
        return {"version": version, "data": data}, tuple(applied)


@dataclass(frozen=True)
class Agent:
    """An agent definition. `instructions` is the system prompt, or a function of the
    session's `SessionState` returning it (called before every model call, so it may read
    the plan or `state.agent_data`). `compatible_since`: sessions started on an older
    version of this agent are refused by this one (marked incompatible), for a change that
    cannot continue them.

    `runner`: an agent whose turn loop is not Respawn's model/tool loop but a foreign
    runner (a LangGraph graph, another SDK) that the worker calls under the session's
    lease (see `agent_runtime.runners`); such an agent has no model, instructions, tools
    or state of Respawn's."""

    name: str
    model: str = ""
    instructions: Instructions = ""
    tools: Sequence[Tool] | ToolRegistry = ()
    version: str = "1"
    description: str = ""
    limits: Limits = field(default_factory=Limits)
    state: AgentState | None = None
    compatible_since: str | None = None
    runner: Runner | None = None

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            who = f"agent {self.name!r}" if isinstance(self.name, str) else "agent"
            raise AgentConfigError(f"{who}: " + "; ".join(problems))
        if not isinstance(self.tools, ToolRegistry):
            # Frozen: the normalised registry replaces the list once, here.
            object.__setattr__(self, "tools", ToolRegistry(list(self.tools)))

    @property
    def tool_registry(self) -> ToolRegistry:
        """The agent's tools by name: `tools` as given, made a registry when the agent
        was built."""
        assert isinstance(self.tools, ToolRegistry)  # __post_init__ replaced a sequence
        return self.tools

    def problems(self) -> list[str]:
        out = []
        if not isinstance(self.name, str) or not NAME.match(self.name):
            out.append(
                "name must be 1-100 letters, digits, '_', '.' or '-' (starting with a letter "
                f"or digit), got {self.name!r}"
            )
        if (
            not isinstance(self.version, str)
            or not self.version.strip()
            or len(self.version) > MAX_VERSION_CHARS
        ):
            out.append(
                f"version must be a non-empty string of at most {MAX_VERSION_CHARS} "
                f"characters, got {self.version!r}"
            )
        if self.runner is not None:
            out.extend(self._runner_problems())
        elif not isinstance(self.model, str) or ":" not in self.model.strip(":"):
            out.append(f"model must look like 'provider:model', got {self.model!r}")
        if not (isinstance(self.instructions, str) or callable(self.instructions)):
            out.append(
                "instructions must be a string or a function of the session state, "
                f"got {type(self.instructions).__name__}"
            )
        out.extend(_tool_problems(self.tools))
        if not isinstance(self.limits, Limits):
            out.append(f"limits must be a Limits, got {type(self.limits).__name__}")
        else:
            out.extend(self.limits.problems())
        if self.state is not None:
            if not isinstance(self.state, AgentState):
                out.append(f"state must be an AgentState, got {type(self.state).__name__}")
            else:
                out.extend(self.state.problems())
        if self.compatible_since is not None:
            if not isinstance(self.compatible_since, str) or not self.compatible_since.strip():
                out.append(
                    f"compatible_since must be a version string, got {self.compatible_since!r}"
                )
            elif isinstance(self.version, str) and version_key(self.compatible_since) > version_key(
                self.version
            ):
                out.append(
                    f"compatible_since ({self.compatible_since}) is newer than the agent's "
                    f"own version ({self.version})"
                )
        return out

    def _runner_problems(self) -> list[str]:
        from .runners import Runner

        out = []
        if not isinstance(self.runner, Runner):
            out.append(f"runner must have a run(context) method, got {type(self.runner).__name__}")
        unused = [
            what
            for what, value in (
                ("a model", self.model),
                ("instructions", self.instructions),
                ("tools", list(self.tools) if not isinstance(self.tools, ToolRegistry) else []),
                ("state", self.state),
            )
            if value
        ]
        if unused:
            out.append(
                f"an agent with a runner has no {', '.join(unused)} of Respawn's: its runner "
                "runs the turn (leave them out)"
            )
        return out

    def render_instructions(self, state: SessionState) -> str:
        """The system prompt for the session's next model call."""
        if isinstance(self.instructions, str):
            return self.instructions
        text = self.instructions(state)
        if not isinstance(text, str):
            raise TypeError(
                f"the instructions function of agent {self.name!r} returned "
                f"{type(text).__name__}, not a string"
            )
        return text

    def refusal(self, *, started: str, last_ran: str | None) -> str | None:
        """Why this version of the agent must not run a session started on version
        `started` and last run on `last_ran`; None when it may. The rule, the same for
        every agent:

        - a session continues on any newer version of its agent;
        - a worker never runs a session that a newer version of the agent already ran
          (or started): that is a rolled-back deploy or a worker left on the old code;
        - an agent that declares `compatible_since` refuses sessions started before it.
        """
        newest = max((v for v in (started, last_ran) if v), key=version_key, default="")
        if newest and version_key(newest) > version_key(self.version):
            return (
                f"agent {self.name!r}: this session already ran on version {newest}, newer "
                f"than this worker's version {self.version}; run it on workers with version "
                f"{newest} or newer"
            )
        if self.compatible_since is not None and version_key(started) < version_key(
            self.compatible_since
        ):
            return (
                f"agent {self.name!r} version {self.version} does not continue sessions "
                f"started before version {self.compatible_since} (this one started on "
                f"{started or 'an unrecorded version'}): the agent declares that change "
                "incompatible"
            )
        return None


def _tool_problems(tools: Any) -> list[str]:
    if isinstance(tools, ToolRegistry):
        return []
    if isinstance(tools, str | bytes) or not isinstance(tools, Iterable):
        return [f"tools must be a list of tools, got {type(tools).__name__}"]
    out = []
    seen: set[str] = set()
    for index, item in enumerate(tools):
        if not isinstance(item, Tool):
            kind = "a plain function" if callable(item) else type(item).__name__
            out.append(f"tools[{index}] is {kind}, not a tool: decorate it with @tool")
        elif item.name in seen:
            out.append(f"two tools are named {item.name!r}")
        else:
            seen.add(item.name)
    return out


_VERSION_PART = re.compile(r"\d+|[A-Za-z]+")


def version_key(version: str | None) -> tuple[tuple[int, Any], ...]:
    """Orders agent versions as people read them: numbers by value ("9" < "10",
    "1.9" < "1.10"), words alphabetically, and numbers after words at the same place
    ("1.0rc1" < "1.0.1"). The empty version (a session recorded before versions were)
    comes before every other."""
    return tuple(
        (1, int(part)) if part.isdigit() else (0, part.lower())
        for part in _VERSION_PART.findall(version or "")
    )


class UnknownAgent(KeyError):
    def __str__(self) -> str:
        return f"unknown agent {self.args[0]!r}"


class AgentRegistry:
    """The agents a process runs, by name."""

    def __init__(self, agents: Iterable[Agent] = ()) -> None:
        self._agents: dict[str, Agent] = {}
        for agent in agents:
            if agent.name in self._agents:
                raise AgentConfigError(f"two agents are named {agent.name!r}")
            self._agents[agent.name] = agent

    def get(self, name: str) -> Agent:
        try:
            return self._agents[name]
        except KeyError:
            raise UnknownAgent(name) from None

    def names(self) -> list[str]:
        return sorted(self._agents)

    def __iter__(self):
        return iter(self._agents[name] for name in self.names())

    def __len__(self) -> int:
        return len(self._agents)

    def __contains__(self, name: object) -> bool:
        return name in self._agents
