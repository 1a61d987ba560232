"""The floor and the peers, each running the same workload as Respawn (`_workload.py`).

- floor: raw psycopg, one JSONB row INSERT + COMMIT (autocommit) per step;
- fenced floor: the same, fenced as every durable step of Respawn's is: one statement
  that advances a session row's sequence only where its fencing token matches and inserts
  the step at it;
- LangGraph + PostgresSaver, durability="sync": a model node and a tools node in a loop,
  the conversation in a list channel, a checkpoint committed after every node;
- DBOS: one workflow per session, the model call and the tool call as steps, each
  step's output committed before the next starts.

The peers are the installed packages of the `bench` extra (`pip install -e .[bench]`);
nothing of theirs is copied here. Each contender has a database of its own, its tables
emptied (TRUNCATE) before every run.

A peer may run sessions in several threads at once (bench.concurrency): the `timings` a
session's steps mark are its own (a context variable, which LangGraph's and DBOS's own
threads inherit), and LangGraph's saver then takes its connections from a pool.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import operator
import uuid
from typing import Annotated, Any, TypedDict

import psycopg

from ._workload import Timings, model_text, table_bytes, tool_output

# --- the floor --------------------------------------------------------------------------

FLOOR_TABLE = "floor_step"


def floor_setup(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {FLOOR_TABLE} ("
            " session_id uuid NOT NULL, seq integer NOT NULL, payload jsonb NOT NULL,"
            " PRIMARY KEY (session_id, seq))"
        )


FENCED_SESSIONS = "fenced_floor_session"
FENCED_STEPS = "fenced_floor_step"


def fenced_floor_setup(url: str) -> None:
    """The fenced floor's tables: a session row with its sequence and fencing token, and
    its steps."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {FENCED_SESSIONS} (id uuid PRIMARY KEY,"
            " last_seq integer NOT NULL, fencing_token bigint NOT NULL, lease_owner text)"
        )
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {FENCED_STEPS} ("
            " session_id uuid NOT NULL, seq integer NOT NULL, payload jsonb NOT NULL,"
            " PRIMARY KEY (session_id, seq))"
        )


def fenced_floor_run(
    url: str, turns: int, payload_bytes: int, timings: Timings, sessions: int = 1
) -> tuple[int, int]:
    """The least a fenced durable step costs on this server: one statement, one commit
    (autocommit), that advances the session row's sequence only where the fencing token
    and the lease holder match, and inserts the step at the sequence it returns; the same
    payloads as the floor. (steps written, bytes the tables grew by)."""
    payloads = [json.dumps(p) for p in floor_payloads(turns, payload_bytes)]
    tables = [FENCED_SESSIONS, FENCED_STEPS]
    sql = (
        f"WITH fenced AS (UPDATE {FENCED_SESSIONS} SET last_seq = last_seq + 1"
        " WHERE id = %s AND fencing_token = %s AND lease_owner = %s RETURNING last_seq)"
        f" INSERT INTO {FENCED_STEPS} (session_id, seq, payload)"
        " SELECT %s, last_seq, %s::jsonb FROM fenced"
    )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {', '.join(tables)}")
        before = table_bytes(conn, tables)
        timings.start()
        for _ in range(sessions):
            session_id = uuid.uuid4()
            conn.execute(
                f"INSERT INTO {FENCED_SESSIONS} (id, last_seq, fencing_token, lease_owner)"
                " VALUES (%s, 0, 1, 'bench')",
                (session_id,),
            )
            for payload in payloads:
                cursor = conn.execute(
                    sql, (session_id, 1, "bench", session_id, payload), prepare=True
                )
                assert cursor.rowcount == 1  # the fence held
                timings.mark()
        grown = table_bytes(conn, tables) - before
    return len(payloads) * sessions, grown


def floor_payloads(turns: int, payload_bytes: int) -> list[dict[str, Any]]:
    """The payloads Respawn writes for the same session, in the same order."""
    from agent_runtime.state import model_payload

    out: list[dict[str, Any]] = [{"content": [{"type": "text", "text": f"run {turns}"}]}]
    out.append({"event": "run_started", "worker": "bench"})
    usage = {"input_tokens": 10, "output_tokens": 5, "cost": 0.0}
    for turn in range(turns):
        call = {"id": f"call_{turn}", "name": "echo_n", "arguments": {"n": turn}}
        out.append(model_payload(model_text(turn, payload_bytes), [call], usage, "bench"))
        out.append({"call_id": call["id"], "name": "echo_n", "arguments": {"n": turn}})
        out.append(
            {
                "call_id": call["id"],
                "name": "echo_n",
                "status": "ok",
                "output": tool_output(turn, payload_bytes),
                "error": None,
                "attempts": 1,
            }
        )
    out.append(model_payload(model_text(turns, payload_bytes), [], usage, "bench"))
    return out


def floor_run(
    url: str, turns: int, payload_bytes: int, timings: Timings, sessions: int = 1
) -> tuple[int, int]:
    """(steps written, bytes the table grew by)."""
    payloads = floor_payloads(turns, payload_bytes)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {FLOOR_TABLE}")
        before = table_bytes(conn, [FLOOR_TABLE])
        timings.start()
        for _ in range(sessions):
            session_id = uuid.uuid4()
            for seq, payload in enumerate(payloads, start=1):
                conn.execute(
                    f"INSERT INTO {FLOOR_TABLE} (session_id, seq, payload) VALUES (%s, %s, %s::jsonb)",
                    (session_id, seq, json.dumps(payload)),
                )
                timings.mark()
        return len(payloads) * sessions, table_bytes(conn, [FLOOR_TABLE]) - before


# --- LangGraph + PostgresSaver -----------------------------------------------------------


class _SessionTimings:
    """`timings`: the Timings of the session the calling thread (or a thread it started)
    runs."""

    def __init__(self) -> None:
        self._timings: contextvars.ContextVar[Timings | None] = contextvars.ContextVar(
            f"timings-{id(self)}", default=None
        )

    @property
    def timings(self) -> Timings | None:
        return self._timings.get()

    @timings.setter
    def timings(self, value: Timings | None) -> None:
        self._timings.set(value)


LANGGRAPH_TABLES = ["checkpoints", "checkpoint_blobs", "checkpoint_writes"]


class _GraphState(TypedDict):
    messages: Annotated[list, operator.add]
    turn: int
    turns: int


class LangGraphPeer(_SessionTimings):
    """`pool_size`: the saver on a psycopg pool of that many connections (opened at once)
    instead of one connection, for sessions run in threads at once. The connections are
    set up as `PostgresSaver.from_conn_string` sets up its own."""

    def __init__(self, url: str, payload_bytes: int, pool_size: int = 0) -> None:
        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.graph import END, START, StateGraph

        super().__init__()
        self.url = url
        self.payload_bytes = payload_bytes
        if pool_size:
            from psycopg.rows import dict_row
            from psycopg_pool import ConnectionPool

            self._pool = ConnectionPool(
                url,
                min_size=pool_size,
                max_size=pool_size,
                kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
                open=True,
            )
            self._pool.wait()
            self._saver_cm = contextlib.nullcontext(PostgresSaver(self._pool))
        else:
            self._pool = None
            self._saver_cm = PostgresSaver.from_conn_string(url)
        self.saver = self._saver_cm.__enter__()
        self.saver.setup()

        def model(state: _GraphState) -> dict[str, Any]:
            self.timings.mark()
            turn = state["turn"]
            calls = (
                [{"id": f"call_{turn}", "name": "echo_n", "args": {"n": turn}}]
                if turn < state["turns"]
                else []
            )
            message = {
                "role": "assistant",
                "content": model_text(turn, self.payload_bytes),
                "tool_calls": calls,
                "usage": {"input_tokens": 10, "output_tokens": 5},
            }
            return {"messages": [message]}

        def tools(state: _GraphState) -> dict[str, Any]:
            self.timings.mark()
            call = state["messages"][-1]["tool_calls"][0]
            result = {
                "role": "tool",
                "tool_call_id": call["id"],
                "name": call["name"],
                "content": json.dumps(tool_output(call["args"]["n"], self.payload_bytes)),
            }
            return {"messages": [result], "turn": state["turn"] + 1}

        def route(state: _GraphState) -> str:
            return "tools" if state["messages"][-1]["tool_calls"] else END

        graph = StateGraph(_GraphState)
        graph.add_node("model", model)
        graph.add_node("tools", tools)
        graph.add_edge(START, "model")
        graph.add_conditional_edges("model", route, ["tools", END])
        graph.add_edge("tools", "model")
        self.graph = graph.compile(checkpointer=self.saver)

    def truncate(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"TRUNCATE {', '.join(LANGGRAPH_TABLES)}")

    def bytes(self) -> int:
        with psycopg.connect(self.url, autocommit=True) as conn:
            return table_bytes(conn, LANGGRAPH_TABLES)

    def run(self, turns: int, timings: Timings) -> int:
        """One session; returns the steps (node runs) it took."""
        self.timings = timings
        config = {
            "configurable": {"thread_id": str(uuid.uuid4())},
            "recursion_limit": 2 * turns + 10,
        }
        timings.start()
        state = self.graph.invoke(
            {"messages": [{"role": "user", "content": f"run {turns}"}], "turn": 0, "turns": turns},
            config,
            durability="sync",
        )
        return len(state["messages"]) - 1

    def close(self) -> None:
        self._saver_cm.__exit__(None, None, None)
        if self._pool is not None:
            self._pool.close()


# --- DBOS ---------------------------------------------------------------------------------


class DBOSPeer(_SessionTimings):
    """`executor_id`: DBOS's name for this process. Processes that share a database need
    names of their own: at launch DBOS takes over the unfinished workflows of its name,
    which would be another process's running ones (DBOS's default name is "local")."""

    def __init__(self, url: str, payload_bytes: int, executor_id: str | None = None) -> None:
        from dbos import DBOS

        super().__init__()
        self.url = url
        self.payload_bytes = payload_bytes
        DBOS(
            config={
                "name": "respawn-bench",
                "system_database_url": url.replace("postgres://", "postgresql://", 1),
                "log_level": "WARNING",
                "run_admin_server": False,
                "executor_id": executor_id,
            }
        )
        peer = self

        @DBOS.step()
        def dbos_model(turn: int, turns: int) -> dict[str, Any]:
            peer.timings.mark()
            calls = (
                [{"id": f"call_{turn}", "name": "echo_n", "args": {"n": turn}}]
                if turn < turns
                else []
            )
            return {
                "role": "assistant",
                "content": model_text(turn, peer.payload_bytes),
                "tool_calls": calls,
                "usage": {"input_tokens": 10, "output_tokens": 5},
            }

        @DBOS.step()
        def dbos_tool(call: dict[str, Any]) -> dict[str, Any]:
            peer.timings.mark()
            return {
                "role": "tool",
                "tool_call_id": call["id"],
                "name": call["name"],
                "content": json.dumps(tool_output(call["args"]["n"], peer.payload_bytes)),
            }

        @DBOS.workflow()
        def dbos_agent(turns: int) -> int:
            messages: list[dict[str, Any]] = [{"role": "user", "content": f"run {turns}"}]
            turn = 0
            while True:
                message = dbos_model(turn, turns)
                messages.append(message)
                if not message["tool_calls"]:
                    return len(messages) - 1
                messages.append(dbos_tool(message["tool_calls"][0]))
                turn += 1

        self._workflow = dbos_agent
        DBOS.launch()

    def tables(self) -> list[str]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT schemaname || '.' || tablename FROM pg_tables WHERE schemaname = 'dbos'"
            ).fetchall()
        return [r[0] for r in rows]

    def truncate(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("TRUNCATE dbos.workflow_status, dbos.operation_outputs CASCADE")

    def bytes(self) -> int:
        with psycopg.connect(self.url, autocommit=True) as conn:
            return table_bytes(conn, self.tables())

    def run(self, turns: int, timings: Timings) -> int:
        self.timings = timings
        timings.start()
        return self._workflow(turns)

    def close(self) -> None:
        from dbos import DBOS

        DBOS.destroy()
