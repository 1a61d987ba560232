"""The floor and the peers, each running the same workload as Respawn (`_workload.py`).

- floor: raw psycopg, one JSONB row INSERT + COMMIT (autocommit) per step;
- LangGraph + PostgresSaver, durability="sync": a model node and a tools node in a loop,
  the conversation in a list channel, a checkpoint committed after every node;
- DBOS: one workflow per session, the model call and the tool call as steps, each
  step's output committed before the next starts.

The peers are the installed packages of the `bench` extra (`pip install -e .[bench]`);
nothing of theirs is copied here. Each contender has a database of its own, its tables
emptied (TRUNCATE) before every run.
"""

from __future__ import annotations

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

LANGGRAPH_TABLES = ["checkpoints", "checkpoint_blobs", "checkpoint_writes"]


class _GraphState(TypedDict):
    messages: Annotated[list, operator.add]
    turn: int
    turns: int


class LangGraphPeer:
    def __init__(self, url: str, payload_bytes: int) -> None:
        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.graph import END, START, StateGraph

        self.url = url
        self.payload_bytes = payload_bytes
        self.timings: Timings | None = None
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


# --- DBOS ---------------------------------------------------------------------------------


class DBOSPeer:
    def __init__(self, url: str, payload_bytes: int) -> None:
        from dbos import DBOS

        self.url = url
        self.payload_bytes = payload_bytes
        self.timings: Timings | None = None
        DBOS(
            config={
                "name": "respawn-bench",
                "system_database_url": url.replace("postgres://", "postgresql://", 1),
                "log_level": "WARNING",
                "run_admin_server": False,
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
