"""The runner of the frameworks' own tests (run.py) and its list of tests that do not apply,
without the network: what make test relies on to select, deal out and skip their tests."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"respawn_{name}_under_test", HERE / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


run = _load("run")
upstream = _load("respawn_upstream")


def test_every_entry_of_the_list_names_a_test_of_a_known_suite_and_gives_its_reason():
    with (HERE / "not_applicable.toml").open("rb") as f:
        listed = tomllib.load(f)
    assert set(listed) == set(run.SUITES)
    for suite in run.SUITES:
        entries = upstream.not_applicable(suite)
        for node, reason in entries.items():
            assert node.startswith("tests/") and "::test_" in node, node
            assert len(reason.split()) >= 4, f"{node}: {reason!r} says too little"


def test_an_entry_without_its_reason_is_refused(tmp_path, monkeypatch):
    bad = tmp_path / "not_applicable.toml"
    bad.write_text('[langgraph]\n"tests/test_x.py::test_y" = " "\n')
    monkeypatch.setattr(upstream, "LIST", bad)
    with pytest.raises(upstream.ListError, match="needs its reason"):
        upstream.not_applicable("langgraph")


def test_shards_share_the_files_by_size_and_keep_each_once():
    files = [("a", 50), ("b", 40), ("c", 30), ("d", 20), ("e", 10)]
    dealt = run.shards(files, 2)
    assert sorted(name for part in dealt for name in part) == ["a", "b", "c", "d", "e"]
    sizes = [sum(dict(files)[name] for name in part) for part in dealt]
    assert sorted(sizes) == [70, 80]
    assert run.shards(files[:1], 2) == [["a"]]


def test_the_files_selected_are_those_that_take_the_adapter(tmp_path):
    tests = tmp_path / "tests"
    (tests / "memory").mkdir(parents=True)
    (tests / "test_graph.py").write_text("def test_a(sync_checkpointer): ...\n")
    (tests / "test_plain.py").write_text("def test_b(): ...\n")
    (tests / "memory" / "test_async.py").write_text(
        "async def test_c(async_checkpointer): ...\nasync def test_d(async_checkpointer): ...\n"
    )
    assert run.selected_files(tmp_path, run.SUITES["langgraph"]) == [
        ("tests/memory/test_async.py", 2),
        ("tests/test_graph.py", 1),
    ]


def test_suite_names_come_first_and_the_rest_goes_to_pytest():
    assert run.split_arguments([]) == (["langgraph", "openai-agents"], [])
    assert run.split_arguments(["openai-agents", "-k", "langgraph"]) == (
        ["openai-agents"],
        ["-k", "langgraph"],
    )
    assert run.split_arguments(["-x", "langgraph"]) == (
        ["langgraph", "openai-agents"],
        ["-x", "langgraph"],
    )
