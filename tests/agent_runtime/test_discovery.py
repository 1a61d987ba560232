"""Finding a deployment's agents: every kind of source, and every mistake named with its
source (the Django system check shows these)."""

from __future__ import annotations

import importlib.metadata
import sys

import pytest

from agent_runtime.discovery import discover


def problems(*paths: str) -> list[tuple[str, str]]:
    found = discover(paths, entry_points=False)
    return [(p.code, str(p)) for p in found.problems]


def test_a_path_may_name_an_agent_a_list_or_a_function():
    found = discover(
        ["acme_agents:entry_agent", "acme_agents:agents_v1", "demo_agents:demo_agents"],
        entry_points=False,
    )
    assert not found.problems
    names = [a.name for a in found.agents]
    assert names[:2] == ["acme-ep", "acme"] and "research" in names
    assert found.sources["acme"] == "RESPAWN_AGENTS entry 'acme_agents:agents_v1'"


@pytest.mark.parametrize(
    "path, code, message",
    [
        ("acme_agents", "path", "must look like 'package.module:attribute'"),
        ("no_such_package:agents", "import", "no module named 'no_such_package'"),
        ("acme_agents:nope", "attribute", "module 'acme_agents' has no attribute 'nope'"),
        ("acme_broken.shapes:number", "not_agent", "is int, not an agent"),
        ("acme_broken.shapes:mixed", "not_agent", "[1] is str"),
        ("acme_broken.shapes:returns_text", "not_agent", "returns_text() returned str"),
        ("acme_broken.shapes:raises", "call", "raised RuntimeError: the agent factory"),
        ("acme_broken.shapes:bad_name", "agent", "agent 'has spaces': name must be"),
        ("acme_broken.shapes:undecorated_tool", "agent", "tools[0] is a plain function"),
        ("acme_broken.shapes:unknown_provider", "model", "unknown model provider 'nowhere'"),
        ("acme_broken.untyped_tool:agents", "import", "parameter 'query' needs a type hint"),
        ("acme_broken.unschema_tool:agents", "import", "cannot become a JSON schema"),
    ],
)
def test_each_mistake_is_named_with_its_path(path, code, message):
    [(found_code, text)] = problems(path)
    assert found_code == code
    assert text.startswith(f"RESPAWN_AGENTS entry {path!r}: ")
    assert message in text


def test_an_import_failure_points_at_the_line_in_the_users_code():
    [(_, text)] = problems("acme_broken.untyped_tool:agents")
    assert "acme_broken/untyped_tool.py:" in text


def test_two_agents_with_one_name_name_both_sources():
    [(code, text)] = problems("acme_agents:agents_v1", "acme_agents:agents_v2")
    assert code == "duplicate"
    assert "two agents are named 'acme' (the other comes from RESPAWN_AGENTS entry" in text


def test_installed_packages_add_their_agents_through_the_entry_point(tmp_path, monkeypatch):
    dist = tmp_path / "acme_support-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-support\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[respawn.agents]\nacme = acme_agents:entry_agent\nbroken = acme_agents:missing\n"
    )
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    importlib.invalidate_caches()
    found = discover([], entry_points=True)
    # Only this package's (a developer may have installed others into the virtualenv).
    ours = [a.name for a in found.agents if "acme-support" in found.sources[a.name]]
    assert ours == ["acme-ep"]
    assert found.sources["acme-ep"] == (
        "entry point 'acme' of package acme-support (acme_agents:entry_agent)"
    )
    [problem] = [p for p in found.problems if "acme-support" in p.source]
    assert str(problem).startswith("entry point 'broken' of package acme-support")
    assert discover([], entry_points=False).agents == []
