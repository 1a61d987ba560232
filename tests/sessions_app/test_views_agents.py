"""The Agents page and the API's agents: who may read them, what they show, what they cost."""

from __future__ import annotations

import pytest
from django.urls import reverse

from sessions_app.models import AgentSession, ApiToken, Status

pytestmark = pytest.mark.django_db


@pytest.fixture
def acme(settings):
    settings.RESPAWN_AGENTS = ["acme_agents:agents_v2"]


def test_viewer_reads_the_agents_page_and_outsider_is_refused(client, users, acme):
    client.force_login(users["outsider"])
    assert client.get(reverse("sessions:agents")).status_code == 403
    client.force_login(users["viewer"])
    page = client.get(reverse("sessions:agents")).content.decode()
    assert 'id="agent-acme"' in page and "version 2" in page
    assert "upgraders from 1" in page  # agent state 1 -> 2
    assert 'id="tool-acme-refund"' in page and "needs approval" in page


def test_agents_page_queries_do_not_grow_with_agents_or_sessions(
    client, users, settings, django_assert_max_num_queries
):
    settings.RESPAWN_AGENTS = ["demo_agents:agents", "acme_agents:agents_v2"]
    for i in range(40):
        AgentSession.objects.create(agent=["demo", "acme", "gone"][i % 3], agent_version=str(i % 4))
    client.force_login(users["viewer"])
    # The session, the user and their groups (the role), live sessions per agent and version.
    with django_assert_max_num_queries(4):
        response = client.get(reverse("sessions:agents"))
    assert response.status_code == 200
    assert "gone</a>: 13 live sessions" in response.content.decode()  # i % 3 == 2


def test_the_list_filters_by_the_version_sessions_started_on(client, users, acme):
    AgentSession.objects.create(agent="acme", agent_version="1", title="old-release")
    AgentSession.objects.create(agent="acme", agent_version="2", title="new-release")
    client.force_login(users["viewer"])
    page = client.get(reverse("sessions:list"), {"agent_version": "1"}).content.decode()
    assert "old-release" in page and "new-release" not in page


def test_api_lists_the_agents_and_filters_sessions_by_version(client, users, acme):
    AgentSession.objects.create(agent="acme", agent_version="1", status=Status.PAUSED)
    AgentSession.objects.create(agent="acme", agent_version="2", status=Status.COMPLETED)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(users['viewer'])[1]}"}
    [agent] = client.get("/api/agents", **auth).json()
    assert (agent["name"], agent["version"], agent["state_version"]) == ("acme", "2", 2)
    assert agent["live_sessions"] == [{"version": "1", "sessions": 1}]
    refund = next(t for t in agent["tools"] if t["name"] == "refund")
    assert refund["needs_approval"] and not refund["idempotent"]
    assert refund["parameters"]["required"] == ["order", "amount_cents"]
    page = client.get("/api/sessions", {"agent_version": "2"}, **auth).json()
    assert [s["agent_version"] for s in page["items"]] == ["2"]
    assert client.get("/api/agents").status_code == 401


@pytest.fixture
def foreign(settings):
    settings.RESPAWN_AGENTS = ["acme_sdk:agents", "acme_graphs:agents"]


def test_the_agents_page_shows_an_sdk_agents_tools_and_a_graphs_nodes(client, users, foreign):
    client.force_login(users["viewer"])
    page = client.get(reverse("sessions:agents")).content.decode()

    def section(agent: str) -> str:
        start = page.index(f'<section class="agent" id="agent-{agent}"')
        return page[start : page.index("</section>", start)]

    sdk = section("acme-sdk")
    assert "OpenAI Agents SDK agent" in sdk and "<code>acme-model</code>" in sdk
    assert "You help Acme&#x27;s customers." in sdk
    assert "Tools (2)" in sdk and 'id="tool-acme-sdk-work"' in sdk
    refund = sdk[sdk.index('id="tool-acme-sdk-refund"') :]
    assert "needs approval" in refund.split("</tr>")[0]
    assert "<code>order</code>: string" in refund and "<code>amount</code>: integer" in refund
    graph = section("acme-graph")
    assert "LangGraph graph" in graph and "Nodes (2)" in graph
    assert 'id="node-acme-graph-model"' in graph and 'id="node-acme-graph-tools"' in graph
    # Respawn applies no limits of its own to a foreign loop: none are claimed.
    assert "200 steps" not in sdk and "200 steps" not in graph


def test_a_foreign_sessions_header_names_its_model_and_no_default_budget(client, users, foreign):
    from agent_runtime.state import SCHEMA_VERSION, SessionState
    from sessions_app.models import Checkpoint
    from sessions_app.selectors.core import session_budgets

    sdk = AgentSession.objects.create(agent="acme-sdk", agent_version="1")
    graph = AgentSession.objects.create(
        agent="acme-graph", agent_version="1", step_count=300, last_seq=300, head=300
    )
    # A graph's checkpoints carry the engine's default budgets, which nothing applies.
    Checkpoint.objects.create(
        session=graph,
        seq=300,
        state=SessionState("acme-graph", "1").to_dict(),
        schema_version=SCHEMA_VERSION,
    )
    client.force_login(users["viewer"])
    page = client.get(reverse("sessions:detail", args=[sdk.id])).content.decode()
    assert "model <code>acme-model</code>" in page
    [steps, *_] = session_budgets(graph)
    assert (steps.name, steps.limit, steps.used, steps.reached) == ("steps", None, 300, False)
    page = client.get(reverse("sessions:detail", args=[graph.id])).content.decode()
    assert "started on version <b>1</b>" in page and "reached" not in page


def test_api_lists_a_graphs_nodes_and_an_sdk_agents_tools(client, users, foreign):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {ApiToken.issue(users['viewer'])[1]}"}
    agents = {a["name"]: a for a in client.get("/api/agents", **auth).json()}
    sdk, graph = agents["acme-sdk"], agents["acme-graph"]
    assert (sdk["kind"], sdk["model"]) == ("OpenAI Agents SDK agent", "acme-model")
    refund = next(t for t in sdk["tools"] if t["name"] == "refund")
    assert refund["needs_approval"] and refund["idempotent"] is None
    assert refund["parameters"]["required"] == ["order", "amount"]
    assert (graph["kind"], graph["nodes"], graph["tools"]) == (
        "LangGraph graph",
        ["model", "tools"],
        [],
    )


def test_a_programs_own_sessions_are_not_listed_as_of_a_missing_agent(client, users, acme):
    AgentSession.objects.create(agent="langgraph", status=Status.WAITING_INPUT)
    AgentSession.objects.create(agent="gone", status=Status.PAUSED)
    client.force_login(users["viewer"])
    page = client.get(reverse("sessions:agents")).content.decode()
    missing = page[page.index('class="agents-missing') : page.index("</section>")]
    assert "gone</a>: 1 live session" in missing and "langgraph" not in missing
    assert "langgraph</a> (a LangGraph program using RespawnSaver): 1 live session" in page
