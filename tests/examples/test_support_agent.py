"""The example agent of the README's "Your own agent": its own package, its own data, the
offline model for tests, an OpenAI-compatible server, and real workers and the API."""

from __future__ import annotations

import sqlite3

import pytest
import support_agent

from agent_runtime import AgentRegistry
from agent_runtime.loop import RunConfig, run_session
from agent_runtime.store import InMemoryEffects, InMemoryStore
from tests.stubs.llm_servers import openai_reply

from ..conftest import PACKAGES, wait_for
from .conftest import SUPPORT_AGENT


@pytest.fixture
def desk_db(tmp_path, monkeypatch):
    path = tmp_path / "desk.sqlite3"
    monkeypatch.setenv("SUPPORT_DESK_DB", str(path))
    return path


def run(store, session_id, agents=None, **config):
    return run_session(
        session_id,
        store=store,
        agents=agents or AgentRegistry(support_agent.agents()),
        effects=InMemoryEffects(),
        config=RunConfig(worker_id="w1", model_backoff=0, **config),
    )


def answer(store, session_id) -> str:
    return store.load_head(session_id).checkpoint.state.final_answer


def test_it_answers_from_the_docs_opens_tickets_and_asks_before_refunding(desk_db):
    store = InMemoryStore()
    store.create_session("s1", "support", "how do I reset my password?")
    assert run(store, "s1").outcome == "completed"
    assert answer(store, "s1").startswith('Open the sign-in page and choose "Forgot password".')
    assert answer(store, "s1").endswith("(from: Resetting your password)")

    store.add_user_message("s1", "urgent: I need a person, checkout is down")
    run(store, "s1")
    assert answer(store, "s1") == "I opened ticket #1 (urgent); a person will answer by email."
    head = store.load_head("s1")
    assert head.checkpoint.state.agent_data == {"tickets": [1]}

    store.add_user_message("s1", "please refund order AB-1234 for 25.00, it arrived broken")
    assert run(store, "s1").outcome == "waiting_input"
    assert store.load_head("s1").checkpoint.state.pending_approval.tool == "issue_refund"
    call_id = store.load_head("s1").checkpoint.state.pending_approval.call_id
    store.add_operator_step("s1", {"action": "approve", "call_id": call_id, "actor": "sam"})
    store.session("s1").status = "queued"
    assert run(store, "s1").outcome == "completed"
    assert answer(store, "s1") == (
        "Refund 1 issued: 25.00 for order AB-1234. It arrives in 5 to 10 business days."
    )
    with sqlite3.connect(desk_db) as db:
        assert db.execute("SELECT order_id, amount_cents FROM refunds").fetchall() == [
            ("AB-1234", 2500)
        ]
        assert db.execute("SELECT priority FROM tickets").fetchall() == [("urgent",)]


def test_it_runs_against_an_openai_compatible_server(openai_server, desk_db):
    openai_server.script(
        openai_reply(None, (("c1", "search_docs", {"query": "refund window"}),)),
        openai_reply(None, (("c2", "read_doc", {"doc_id": "refunds"}),)),
        openai_reply("Orders can be refunded within 30 days of purchase."),
    )
    store = InMemoryStore()
    store.create_session("s2", "support", "how long do I have to ask for a refund?")
    result = run(
        store,
        "s2",
        model_override="openai:gpt-4o-mini",
        provider_options={"openai_base_url": f"{openai_server.url}/v1", "openai_api_key": "k"},
    )
    assert result.outcome == "completed"
    assert answer(store, "s2") == "Orders can be refunded within 30 days of purchase."
    first, _, last = openai_server.bodies()
    assert first["messages"][0] == {"role": "system", "content": support_agent.INSTRUCTIONS}
    tools = {t["function"]["name"]: t["function"] for t in first["tools"]}
    assert set(tools) == {"search_docs", "read_doc", "open_ticket", "ticket_status", "issue_refund"}
    amount = tools["issue_refund"]["parameters"]["properties"]["amount_cents"]
    assert amount["exclusiveMinimum"] == 0 and amount["maximum"] == 500_000
    assert tools["open_ticket"]["parameters"]["properties"]["priority"]["enum"] == [
        "low",
        "normal",
        "urgent",
    ]
    assert "Orders can be refunded within 30 days" in last["messages"][-1]["content"]


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_runs_it_and_a_person_approves_the_refund_over_the_api(
    settings, start_worker, client, users, desk_db
):
    from sessions_app.models import AgentSession, ApiToken, Status

    settings.RESPAWN_AGENTS = ["support_agent:agents", "demo_agents:agents"]
    start_worker(
        RESPAWN_AGENTS="support_agent:agents,demo_agents:agents",
        PYTHONPATH=f"{SUPPORT_AGENT}:{PACKAGES}",
        SUPPORT_DESK_DB=str(desk_db),
    )
    token = ApiToken.issue(users["operator"])[1]
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    started = client.post(
        "/api/sessions",
        {"agent": "support", "input": "refund order ZX-9 for 12.50, wrong size"},
        content_type="application/json",
        **auth,
    )
    assert started.status_code == 201, started.content
    session_id = started.json()["id"]
    assert started.json()["agent_version"] == "1"

    def status() -> str:
        return client.get(f"/api/sessions/{session_id}", **auth).json()["status"]

    wait_for(lambda: status() == Status.WAITING_INPUT, what="the refund to wait for approval")
    detail = client.get(f"/api/sessions/{session_id}", **auth).json()
    assert detail["pending_approval"]["tool"] == "issue_refund"
    assert detail["pending_approval"]["arguments"]["amount_cents"] == 1250
    approved = client.post(f"/api/sessions/{session_id}/approve", {}, "application/json", **auth)
    assert approved.status_code == 202, approved.content
    wait_for(lambda: status() == Status.COMPLETED, what="the approved refund")
    session = AgentSession.objects.get(id=session_id)
    assert session.final_answer.startswith("Refund 1 issued: 12.50 for order ZX-9.")

    agents = {a["name"]: a for a in client.get("/api/agents", **auth).json()}
    assert agents["support"]["tools"][-1]["needs_approval"] is True
    client.force_login(users["viewer"])
    page = client.get(f"/sessions/{session_id}/").content.decode()
    assert "started on version <b>1</b>" in page and "issue_refund" in page
