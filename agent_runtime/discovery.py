"""Finding the agents a deployment runs: `module:attribute` paths and installed packages.

Each path names an `Agent`, a list (or tuple, or `AgentRegistry`) of agents, or a function
of no arguments returning either. Installed packages declare theirs in the
`respawn.agents` entry-point group, in the same form:

    [project.entry-points."respawn.agents"]
    support = "support_agent:agents"

`discover` never raises for a bad source: it returns every problem it found, each naming
its source, so that a deployment check can list them all at once (the Django side turns
them into system check errors, before any worker or web process starts).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .agents import Agent, AgentConfigError, AgentRegistry
from .providers import split_model_name

ENTRY_POINT_GROUP = "respawn.agents"
_ENGINE_DIR = str(Path(__file__).resolve().parent)


@dataclass(frozen=True)
class Problem:
    source: str  # "RESPAWN_AGENTS entry 'pkg.mod:agents'", "entry point 'x' (pkg:attr)"
    message: str
    code: str  # a short stable id: "import", "attribute", "not_agent", "duplicate", ...

    def __str__(self) -> str:
        return f"{self.source}: {self.message}"


@dataclass
class Discovery:
    agents: list[Agent] = field(default_factory=list)
    # agent name -> where it came from (for the agents page and duplicate errors)
    sources: dict[str, str] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    def registry(self) -> AgentRegistry:
        return AgentRegistry(self.agents)


def discover(paths: Iterable[str], *, entry_points: bool = True) -> Discovery:
    """Load every agent named by `paths` and, with `entry_points`, by installed packages."""
    found = Discovery()
    for path in paths:
        _load_source(found, f"RESPAWN_AGENTS entry {path!r}", path, lambda p=path: _import(p))
    if entry_points:
        for ep in sorted(
            importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name
        ):
            dist = getattr(ep, "dist", None)
            where = f" of package {dist.name}" if dist is not None else ""
            source = f"entry point {ep.name!r}{where} ({ep.value})"
            _load_source(found, source, ep.value, ep.load)
    for agent in found.agents:
        if agent.runner is not None:
            continue  # its runner runs the turn: no model of Respawn's
        try:
            split_model_name(agent.model)
        except ValueError as exc:
            found.problems.append(
                Problem(found.sources[agent.name], f"agent {agent.name!r}: {exc}", "model")
            )
    return found


class _SourceError(Exception):
    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def _import(path: str) -> Any:
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise _SourceError("must look like 'package.module:attribute'", "path")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise _SourceError(
                f"no module named {exc.name!r} (is the package installed, or on PYTHONPATH?)",
                "import",
            ) from None
        raise _SourceError(_import_failure(module_name, exc), "import") from None
    except Exception as exc:
        raise _SourceError(_import_failure(module_name, exc), "import") from None
    value: Any = module
    for part in attribute.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise _SourceError(
                f"module {module_name!r} has no attribute {attribute!r}", "attribute"
            ) from None
    return value


def _import_failure(module_name: str, exc: BaseException) -> str:
    # The user's own code failed while importing (a bad @tool, a typo): its last frame
    # outside the engine and importlib says where.
    frames = traceback.extract_tb(exc.__traceback__)
    own = [
        f
        for f in frames
        if "importlib" not in f.filename and not f.filename.startswith(_ENGINE_DIR)
    ]
    at = f" (at {own[-1].filename}:{own[-1].lineno})" if own else ""
    return f"importing {module_name!r} failed: {type(exc).__name__}: {exc}{at}"


def _load_source(found: Discovery, source: str, path: str, load: Any) -> None:
    try:
        value = load()
    except _SourceError as exc:
        found.problems.append(Problem(source, str(exc), exc.code))
        return
    except Exception as exc:  # an entry point's import of the package's own code
        module_name = path.partition(":")[0]
        found.problems.append(Problem(source, _import_failure(module_name, exc), "import"))
        return
    try:
        agents = _agents_of(value, path)
    except _SourceError as exc:
        found.problems.append(Problem(source, str(exc), exc.code))
        return
    for agent in agents:
        if agent.name in found.sources:
            found.problems.append(
                Problem(
                    source,
                    f"two agents are named {agent.name!r} (the other comes from "
                    f"{found.sources[agent.name]})",
                    "duplicate",
                )
            )
            continue
        found.sources[agent.name] = source
        found.agents.append(agent)


def _agents_of(value: Any, path: str) -> list[Agent]:
    if isinstance(value, Agent):
        return [value]
    if callable(value) and not isinstance(value, AgentRegistry | list | tuple):
        try:
            value = value()
        except AgentConfigError as exc:
            raise _SourceError(str(exc), "agent") from None
        except Exception as exc:
            raise _SourceError(
                f"calling {path} raised {type(exc).__name__}: {exc}", "call"
            ) from None
        if isinstance(value, Agent):
            return [value]
        what = f"{path}() returned"
    else:
        what = f"{path} is"
    if isinstance(value, AgentRegistry | list | tuple):
        agents = list(value)
        wrong = [
            f"[{i}] is {type(a).__name__}" for i, a in enumerate(agents) if not isinstance(a, Agent)
        ]
        if wrong:
            raise _SourceError(
                f"{what} a list whose items are not all agents: {', '.join(wrong)}", "not_agent"
            )
        return agents
    raise _SourceError(
        f"{what} {type(value).__name__}, not an agent, a list of agents, or a function "
        "returning them",
        "not_agent",
    )
