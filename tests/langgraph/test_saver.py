"""RespawnSaver with real graphs: a thread is a session the dashboard shows, storage grows
with the steps, interrupts and time travel work, and one writer at a time."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import time

import pytest
from acme_graphs import builder
from django.urls import reverse
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.types import Command

from sessions_app.langgraph.saver import RespawnSaver, ThreadLeaseLost, session_id_for
from sessions_app.models import (
    AgentSession,
    ApiToken,
    AuditEvent,
    Checkpoint,
    GraphBlob,
    GraphCheckpoint,
    GraphThread,
    Step,
)

from ..conftest import ROOT, database_url

pytestmark = pytest.mark.django_db(transaction=True)


def _config(thread: str) -> dict:
    return {"configurable": {"thread_id": thread}}


def _say(text: str) -> dict:
    return {"messages": [HumanMessage(text)]}


def test_a_thread_is_a_session_with_its_trace_and_checkpoints(client, users, make_saver):
    saver = make_saver()
    graph = builder().compile(checkpointer=saver)
    result = graph.invoke(_say("loop 3"), _config("ticket-42"))
    assert result["messages"][-1].content == "Worked 3 steps."

    session = AgentSession.objects.get(id=session_id_for("ticket-42"))
    assert GraphThread.objects.get(session=session).thread_id == "ticket-42"
    assert session.agent == "langgraph" and session.status == "waiting_input"
    checkpoints = GraphCheckpoint.objects.filter(session=session)
    # Every LangGraph checkpoint is a Respawn checkpoint at its step's seq.
    assert checkpoints.count() == Checkpoint.objects.filter(session=session).count() > 8
    events = list(Step.objects.filter(session=session).values_list("payload__event", flat=True))
    assert events.count("graph_checkpoint") == checkpoints.count()
    nodes = [
        p["node"]
        for p in Step.objects.filter(session=session, payload__event="graph_writes").values_list(
            "payload", flat=True
        )
    ]
    assert nodes.count("tools") == 3 and nodes.count("model") == 4
    latest = checkpoints.order_by("-checkpoint_id").first()
    assert session.head == latest.seq  # the head is the thread's latest checkpoint
    state = Checkpoint.objects.get(session=session, seq=session.head).state
    assert state["agent_state"]["data"]["langgraph"]["checkpoint_id"] == latest.checkpoint_id

    # The thread's answer is the session's, as for any agent: on the row, in the head
    # checkpoint and in the API.
    assert session.final_answer == "Worked 3 steps." == state["final_answer"]
    client.force_login(users["operator"])
    token = ApiToken.issue(users["viewer"])[1]
    api = client.get(f"/api/sessions/{session.id}", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert api.status_code == 200 and api.json()["final_answer"] == "Worked 3 steps."
    page = client.get(reverse("sessions:detail", args=[session.id]))
    assert page.status_code == 200
    assert b"graph_writes" in page.content and b"Worked 3 steps." in page.content
    # The header names the model the graph's messages say answered them.
    assert b"model <code>acme-fake-1</code>" in page.content
    first = Checkpoint.objects.filter(session=session).order_by("seq").first()
    diff = client.get(reverse("sessions:diff", args=[session.id]), {"a": first.pk, "b": "head"})
    assert diff.status_code == 200
    # What changed between two checkpoints of the graph: its channels' versions.
    assert b"channel_versions.messages" in diff.content


def test_storage_grows_with_the_steps_not_with_the_history(make_saver):
    saver = make_saver()
    graph = builder().compile(checkpointer=saver)
    graph.invoke(_say("loop 40"), _config("long"))
    session_id = session_id_for("long")
    blobs = list(
        GraphBlob.objects.filter(session_id=session_id, channel="messages").order_by("version")
    )
    # The first version of the list is stored whole, every later one as what was added
    # since the version it builds on: the k-th on the (k & (k - 1))-th, so a reader loads
    # at most log2(k) + 1 versions and the list's items are stored about log2(k) / 2 times
    # each (PostgresSaver stores the whole list every version).
    assert blobs[0].base_version is None
    assert all(b.base_version is not None for b in blobs[1:])
    position = {b.version: k for k, b in enumerate(blobs)}
    assert all(position[b.base_version] == k & (k - 1) for k, b in enumerate(blobs) if k)
    links, newest = 0, blobs[-1]
    by_version = {b.version: b for b in blobs}
    while newest.base_version is not None:
        links, newest = links + 1, by_version[newest.base_version]
    assert links <= math.log2(len(blobs)) + 1
    messages = graph.get_state(_config("long")).values["messages"]
    whole = len(saver.serde.dumps_typed(messages)[1])
    stored = sum(len(bytes(b.blob)) for b in blobs)
    assert stored <= (math.log2(len(blobs)) / 2 + 2) * whole

    # A fresh saver (no cache) reads back what the run had, message for message.
    fresh = builder().compile(checkpointer=make_saver())
    values = fresh.get_state(_config("long")).values["messages"]
    assert len(values) == 1 + 40 * 2 + 1
    assert values[-1].content == "Worked 40 steps."
    assert [m.id for m in values] == [
        m.id for m in graph.get_state(_config("long")).values["messages"]
    ]
    # And every checkpoint in the history, each with its own length.
    lengths = [len(s.values.get("messages", [])) for s in fresh.get_state_history(_config("long"))]
    assert lengths[0] == 82 and sorted(lengths, reverse=True) == lengths


def test_a_list_stored_version_on_version_reads_back(make_saver):
    """Threads written before lists were stored as a Fenwick tree have each version on the
    one before: the same values read back from them."""
    saver = make_saver()
    graph = builder().compile(checkpointer=saver)
    graph.invoke(_say("loop 12"), _config("old"))
    before = [s.values for s in graph.get_state_history(_config("old"))]
    session_id = session_id_for("old")
    blobs = list(
        GraphBlob.objects.filter(session_id=session_id, channel="messages").order_by("version")
    )
    items: dict[str, list] = {}
    for blob in blobs:
        value = saver.serde.loads_typed((blob.type, bytes(blob.blob)))
        items[blob.version] = (
            value if blob.base_version is None else items[blob.base_version] + value
        )
    for previous, blob in zip(blobs, blobs[1:], strict=False):
        added = items[blob.version][len(items[previous.version]) :]
        GraphBlob.objects.filter(pk=blob.pk).update(
            base_version=previous.version, blob=saver.serde.dumps_typed(added)[1]
        )
    assert GraphBlob.objects.filter(base_version=blobs[-2].version).exists()

    fresh = builder().compile(checkpointer=make_saver())
    assert [s.values for s in fresh.get_state_history(_config("old"))] == before
    assert fresh.get_state(_config("old")).values == before[0]


def test_interrupt_then_resume_with_a_value(make_saver):
    graph = builder().compile(checkpointer=make_saver())
    out = graph.invoke(_say("approve the refund"), _config("approval"))
    assert out["__interrupt__"][0].value == {"question": "may I the refund?"}
    # Another saver (another process) answers it.
    again = builder().compile(checkpointer=make_saver())
    out = again.invoke(Command(resume="yes, go"), _config("approval"))
    assert out["messages"][-1].content == "the refund: yes, go"


def test_time_travel_from_an_earlier_checkpoint_branches_the_thread(make_saver):
    graph = builder().compile(checkpointer=make_saver())
    graph.invoke(_say("loop 2"), _config("travel"))
    history = list(graph.get_state_history(_config("travel")))
    earlier = next(s for s in history if s.next == ("tools",))
    graph.invoke(None, earlier.config)
    after = list(graph.get_state_history(_config("travel")))
    assert len(after) > len(history)
    branched = [
        s
        for s in after
        if s.parent_config
        and s.parent_config["configurable"]["checkpoint_id"]
        == earlier.config["configurable"]["checkpoint_id"]
    ]
    assert len(branched) == 2  # the first run's next checkpoint and the new branch's


def _put(saver, thread, parent=None):
    checkpoint = empty_checkpoint()
    config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    if parent:
        config["configurable"]["checkpoint_id"] = parent
    return saver.put(config, checkpoint, {"source": "loop", "step": 0}, {})


def _rows(thread):
    sid = session_id_for(thread)
    return (
        Step.objects.filter(session_id=sid).count(),
        GraphCheckpoint.objects.filter(session_id=sid).count(),
        Checkpoint.objects.filter(session_id=sid).count(),
    )


def test_a_superseded_writer_is_refused_and_writes_nothing(make_saver):
    first, second = make_saver(), make_saver()
    c1 = _put(first, "shared")
    # A second writer takes the thread over (the first stalled, say).
    c2 = _put(second, "shared", c1["configurable"]["checkpoint_id"])
    before = _rows("shared")
    with pytest.raises(ThreadLeaseLost, match="superseded"):
        _put(first, "shared", c1["configurable"]["checkpoint_id"])
    with pytest.raises(ThreadLeaseLost, match="superseded"):
        first.put_writes(c1, [("messages", ["late"])], "task-1")
    assert _rows("shared") == before
    # The second writer goes on; its chain is the thread's.
    _put(second, "shared", c2["configurable"]["checkpoint_id"])
    assert _rows("shared")[1] == before[1] + 1
    session = AgentSession.objects.get(id=session_id_for("shared"))
    assert session.fencing_token == 2 and session.lease_owner == second._owner


def test_a_new_threads_first_write_is_the_session_the_claim_would_make(make_saver):
    """A new thread's first write creates its session, thread row and lease at once; a
    writer that starts the same thread afresh (no parent) finds it there and takes it over
    as any writer does, writing nothing twice."""
    first, second = make_saver(), make_saver()
    mine = _put(first, "fresh")
    session = AgentSession.objects.get(id=session_id_for("fresh"))
    assert (session.agent, session.status) == ("langgraph", "waiting_input")
    assert session.title == "LangGraph thread fresh"
    assert (session.last_seq, session.step_count, session.head) == (1, 1, 1)
    assert session.lease_owner == first._owner and session.fencing_token == 1
    assert session.lease_expires_at > session.created_at
    assert GraphThread.objects.get(session=session).thread_id == "fresh"
    assert _rows("fresh") == (1, 1, 1)
    state = Checkpoint.objects.get(session=session).state
    assert state["agent"]["name"] == "langgraph" and state["counters"]["steps"] == 1

    _put(second, "fresh")  # no parent: as a new thread, which it is not
    session.refresh_from_db()
    assert session.lease_owner == second._owner and session.fencing_token == 2
    assert (session.last_seq, session.step_count) == (2, 2)
    assert _rows("fresh") == (2, 2, 2) and GraphThread.objects.filter(session=session).count() == 1
    with pytest.raises(ThreadLeaseLost, match="superseded"):  # its run goes on: refused
        _put(first, "fresh", mine["configurable"]["checkpoint_id"])


def test_two_writers_running_one_thread_cannot_both_commit(make_saver):
    """Two processes invoke the same thread at once (langgraph issue 8796): one wins, the
    other is refused, and the chain of checkpoints stays a chain."""
    setup = builder().compile(checkpointer=make_saver())
    setup.invoke(_say("hello"), _config("race"))
    results: dict[str, object] = {}
    barrier = threading.Barrier(2)

    def run(name):
        from django.db import connection

        graph = builder().compile(checkpointer=make_saver())
        graph.get_state(_config("race"))  # both read the same latest checkpoint
        barrier.wait()
        try:
            results[name] = graph.invoke(_say(f"loop 3 {name}"), _config("race"))
        except ThreadLeaseLost as exc:
            results[name] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert set(results) == {"a", "b"}, results
    refused = [r for r in results.values() if isinstance(r, ThreadLeaseLost)]
    done = [r for r in results.values() if isinstance(r, dict)]
    assert refused and len(done) <= 1, results
    parents = list(
        GraphCheckpoint.objects.filter(session_id=session_id_for("race"), ns="").values_list(
            "parent_id", flat=True
        )
    )
    assert len(parents) == len(set(parents)), "two checkpoints share a parent: the chain forked"
    if done:
        final = builder().compile(checkpointer=make_saver()).get_state(_config("race"))
        assert final.values["messages"][-1].content == "Worked 3 steps."


def test_a_saver_writes_on_its_own_connection_whichever_thread_calls(make_saver):
    """The calling thread lends the saver no transaction: a graph run inside the caller's
    open transaction is committed on its own (another connection sees it) and the caller's
    connection is its own again afterwards; a call from an event loop, where Django
    refuses database calls, is made all the same."""
    import asyncio

    import psycopg
    from django.db import connection, transaction

    saver = make_saver()
    graph = builder().compile(checkpointer=saver)
    mine = connection
    with transaction.atomic():
        AgentSession.objects.exists()  # the caller's transaction has begun
        graph.invoke(_say("loop 1"), _config("own"))
        with psycopg.connect(database_url(), autocommit=True) as other:
            seen = other.execute(
                "SELECT count(*) FROM sessions_app_graphcheckpoint WHERE session_id = %s",
                [session_id_for("own")],
            ).fetchone()[0]
        assert seen > 0, "the saver's writes waited for the caller's transaction"
        assert connection.in_atomic_block and connection is mine

    async def from_a_loop():
        return saver.get_tuple({"configurable": {"thread_id": "own"}})

    latest = asyncio.run(from_a_loop())
    assert latest is not None and latest.checkpoint["channel_values"]["messages"]


def test_a_savers_own_connection_plans_once_and_never_compiles(make_saver):
    """The saver's connection has PostgreSQL plan its prepared statements once and never
    JIT-compile them, again after it reconnects; the caller's connection keeps the
    server's defaults."""
    from django.db import connection

    def settings_of(wrapper) -> tuple[str, str]:
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT current_setting('plan_cache_mode'), current_setting('jit')")
            return cursor.fetchone()

    defaults = settings_of(connection)
    assert defaults[0] == "auto"
    saver = make_saver()
    graph = builder().compile(checkpointer=saver)
    graph.invoke(_say("loop 1"), _config("planned"))
    own = saver._own._connection
    assert saver._own.call(settings_of, own) == ("force_generic_plan", "off")
    own.close()  # the next call connects again
    assert saver.get_tuple(_config("planned")) is not None
    assert saver._own.call(settings_of, own) == ("force_generic_plan", "off")
    assert settings_of(connection) == defaults


def test_behind_a_transaction_pooler_a_savers_connection_sets_nothing(settings, make_saver):
    """With RESPAWN_POOLER_SAFE a SET would stay on whichever server connection the pooler
    picked, for other clients: the saver leaves the server's defaults alone."""
    settings.RESPAWN_POOLER_SAFE = True

    def settings_of(wrapper) -> tuple[str, str]:
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT current_setting('plan_cache_mode'), current_setting('jit')")
            return cursor.fetchone()

    saver = make_saver()
    graph = builder().compile(checkpointer=saver)
    graph.invoke(_say("loop 1"), _config("pooled"))
    own = saver._own._connection
    assert saver._own.call(settings_of, own)[0] == "auto"


def test_a_worker_running_the_thread_keeps_other_writers_out(settings, make_saver):
    from agent_runtime.store import Lease

    saver = make_saver()
    _put(saver, "worked")
    session = AgentSession.objects.get(id=session_id_for("worked"))
    from django.utils import timezone

    AgentSession.objects.filter(id=session.id).update(
        lease_owner="host:1:worker",
        fencing_token=7,
        lease_expires_at=timezone.now() + timezone.timedelta(minutes=1),
    )
    with pytest.raises(ThreadLeaseLost, match="run by worker host:1:worker"):
        _put(make_saver(), "worked")
    bound = RespawnSaver(lease=Lease(str(session.id), "host:1:worker", 7))
    _put(bound, "worked")
    assert _rows("worked")[1] == 2


def test_delete_thread_leaves_an_audit_record(make_saver):
    saver = make_saver()
    _put(saver, "gone")
    saver.delete_thread("gone")
    assert not AgentSession.objects.filter(id=session_id_for("gone")).exists()
    assert AuditEvent.objects.filter(
        session_id=session_id_for("gone"), action="graph_delete_thread"
    ).exists()


def test_from_conn_string_uses_the_projects_database():
    with RespawnSaver.from_conn_string(database_url()) as saver:
        saver.setup()
        assert saver._db == "default"
        _put(saver, "by-url")
    assert _rows("by-url")[1] == 1


def test_importing_without_langgraph_says_what_to_install():
    code = (
        "import sys; sys.modules['langgraph'] = None; sys.modules['langgraph.checkpoint'] = None\n"
        "import sessions_app.langgraph.saver"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert (
        "sessions_app.langgraph.saver needs LangGraph: install it with `pip install langgraph`"
        in done.stderr
    )


def test_a_programs_own_thread_is_not_queued_for_workers_nor_marked_incompatible(
    make_saver, users, client
):
    """A thread a program checkpoints under the default agent name is run by that program:
    resume, a message or an answer from the dashboard would queue it for workers that do
    not have it (and fail it), so each is refused naming why; the compatibility re-check
    leaves it to its program, as the deploy gate does."""
    from sessions_app.services.core import (
        ActionError,
        session_check_compat,
        session_resume,
        session_send_message,
    )

    graph = builder().compile(checkpointer=make_saver())
    graph.invoke(_say("loop 1"), _config("program-thread"))
    session = AgentSession.objects.get(id=session_id_for("program-thread"))
    assert session.agent == "langgraph" and session.run_by_program()
    for act in (
        lambda: session_resume(session_id=session.id, actor=users["operator"]),
        lambda: session_send_message(session_id=session.id, content="hi", actor=users["operator"]),
    ):
        with pytest.raises(ActionError, match="run by its own program"):
            act()
    session.refresh_from_db()
    assert session.status == "waiting_input"
    assert session_check_compat(session_id=session.id, actor=users["operator"]) == ""
    session.refresh_from_db()
    assert session.incompatible_at is None
    # Its page says who it waits for, and offers no action the workers would take.
    client.force_login(users["operator"])
    page = client.get(reverse("sessions:detail", args=[session.id])).content.decode()
    assert "Waiting for its program" in page and "Waiting for a person" not in page
    assert reverse("sessions:action", args=[session.id, "resume"]) not in page


CLOCK_PROGRAM = """
import sys
from typing import TypedDict

from langgraph.graph import END, START, StateGraph

from sessions_app.langgraph import RespawnSaver


class State(TypedDict):
    n: int


graph = StateGraph(State)
graph.add_node("step", lambda state: {"n": state["n"] + 1})
graph.add_edge(START, "step")
graph.add_edge("step", END)
saver = RespawnSaver(lease_ttl=30)
graph.compile(checkpointer=saver).invoke({"n": 0}, {"configurable": {"thread_id": sys.argv[1]}})
"""


@pytest.mark.parametrize("offset", ["+10m", "-10m"])
def test_a_programs_lease_is_kept_on_the_databases_clock(transactional_db, offset):
    """A program whose clock is ten minutes off (Debian's faketime) leaves its thread's
    lease expiring in at most its lease_ttl on the database's clock: a clock ahead does
    not hold the thread for ten more minutes, one behind does not leave it unheld."""
    from django.db import connection

    thread = f"clock{offset}"
    # The program's clock is off indeed.
    shown = float(_faked(offset, "-c", "import time; print(time.time())"))
    assert abs(shown - time.time() - (600 if offset[0] == "+" else -600)) < 60
    _faked(offset, "-c", CLOCK_PROGRAM, thread)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM lease_expires_at - statement_timestamp()), lease_owner"
            " FROM sessions_app_agentsession WHERE id = %s",
            [session_id_for(thread)],
        )
        left, owner = cursor.fetchone()
    assert owner and owner.startswith("langgraph:")
    assert 0 < float(left) <= 30, f"the lease expires in {float(left):.0f} s by the database"


def _faked(offset: str, *args: str) -> str:
    """`python *args` with its clock `offset` off (Debian's faketime); its output."""
    import shutil

    from ..conftest import program_env

    faketime = shutil.which("faketime")
    assert faketime, "faketime is not installed (Debian/Ubuntu: apt-get install faketime)"
    done = subprocess.run(
        [faketime, "-f", offset, sys.executable, *args],
        cwd=ROOT,
        env=program_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_checkpoint_with_a_secret_is_sealed_whole_with_its_agent_and_step_count(make_saver):
    """A graph whose answer shows a secret: each Respawn checkpoint's state is stored
    sealed, and its exact copy (what a run reads back) holds the agent and step count its
    masked view shows, as a state with nothing to seal has them (one statement)."""
    from langchain_core.messages import AIMessage
    from langgraph.graph import START, MessagesState, StateGraph

    from sessions_app.sealing import exact

    secret = "sk-proj-FAKEfakeFAKEfake0123456789abcdefgh"

    def answer(state: MessagesState) -> dict:
        said = state["messages"][-1].content
        return {"messages": [AIMessage(f"the key is {secret}" if "key" in said else "hello")]}

    flow = StateGraph(MessagesState)
    flow.add_node("answer", answer)
    flow.add_edge(START, "answer")
    graph = flow.compile(checkpointer=make_saver())
    for text in ("hi", "the key?", "and again"):
        graph.invoke(_say(text), _config("sealed-thread"))
    session = AgentSession.objects.get(id=session_id_for("sealed-thread"))
    checkpoints = list(Checkpoint.objects.filter(session=session).order_by("seq"))
    assert len(checkpoints) >= 6
    answers = set()
    for checkpoint in checkpoints:
        whole = exact(checkpoint.state)
        assert whole["agent"] == checkpoint.state["agent"]
        assert whole["agent"]["name"] == session.agent == "langgraph"
        assert whole["counters"]["steps"] == checkpoint.state["counters"]["steps"]
        assert whole["counters"]["steps"] == checkpoint.seq
        answers.add(whole["final_answer"])
    assert f"the key is {secret}" in answers and "hello" in answers
    assert secret not in str([c.state for c in checkpoints])  # the views are masked
