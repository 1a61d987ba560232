"""LangGraph's own conformance suite (langgraph-checkpoint-conformance) against both
savers, every capability the installed version knows, on the test database."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES, Capability

from sessions_app.langgraph.saver import AsyncRespawnSaver, RespawnSaver

pytestmark = pytest.mark.django_db(transaction=True)


def _run_suite(cls):
    @checkpointer_test(name=cls.__name__)
    async def factory():
        saver = cls()
        try:
            yield saver
        finally:
            await asyncio.to_thread(saver.close)

    # On a thread of its own: an earlier test in this process (Playwright's sync API, for
    # the browser tests) may leave an event loop running on the main thread.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, validate(factory)).result()


@pytest.mark.parametrize("cls", [RespawnSaver, AsyncRespawnSaver], ids=lambda c: c.__name__)
def test_saver_passes_langgraph_conformance_suite(cls):
    report = _run_suite(cls)
    summary = json.dumps(report.to_dict(), indent=1, default=str)
    # Every capability the installed suite knows, base and extended.
    assert set(report.results) == {c.value for c in Capability}, summary
    assert {c.value for c in ALL_CAPABILITIES} <= set(report.results), summary
    for name, result in report.results.items():
        assert result.detected, f"{name} not implemented\n{summary}"
        assert result.passed, f"{name} failed\n{summary}"
        assert result.tests_passed > 0 and result.tests_failed == 0, summary
