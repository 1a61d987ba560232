"""LangGraph on Respawn: a checkpointer that writes a graph's threads as Respawn sessions,
and graphs run by Respawn's workers.

    from sessions_app.langgraph.saver import RespawnSaver

    with RespawnSaver.from_conn_string(DATABASE_URL) as saver:
        saver.setup()
        graph = builder.compile(checkpointer=saver)
        graph.invoke(inputs, {"configurable": {"thread_id": "ticket-42"}})

A thread is a session (its id is the thread id when that is a UUID, else derived from
it), each LangGraph checkpoint a Respawn checkpoint with a `graph_checkpoint` step, each
task's writes a `graph_writes` step: the dashboard shows a thread's trace, checkpoints,
diffs and audit like any session's. Channel values are stored once per version, and a list
that grows by appending (messages) as what was appended: storage grows with the steps.

One writer per thread: a saver's writes carry a lease and fencing token, as Respawn's
workers' do. A saver takes a thread's lease at its first write there (from another saver
whose run it supersedes, never from a worker running the session); a writer that was
superseded has its next write refused with `ThreadLeaseLost`, and that write leaves
nothing behind. `graph_agent` registers a compiled graph as a Respawn agent, run by the
workers with a saver bound to the session's lease.

langgraph and langgraph-checkpoint are needed (`pip install langgraph`); this module says
so when they are missing.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import functools
import json
import os
import random
import re
import socket
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import datetime, timedelta
from typing import Any, NamedTuple

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        get_checkpoint_id,
        get_serializable_checkpoint_metadata,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "sessions_app.langgraph.saver needs LangGraph: install it with `pip install langgraph` "
        "(it brings langgraph-checkpoint), or Respawn's `langgraph` extra "
        f"(`pip install 'respawn[langgraph]'`). ({exc})"
    ) from exc

from agent_runtime.agents import Agent
from agent_runtime.runners import (
    Problem,
    RunContext,
    RunnerCancelled,
    RunnerDescription,
    RunnerResult,
)
from agent_runtime.state import (
    OperatorAction,
    SessionState,
    StepKind,
    as_operator,
    step_text,
)
from agent_runtime.store import Lease, LeaseLost, SessionHead

from ..sdk_glue import OwnConnection, ensure_django, session_id_in
from ..sdk_glue import now as _now
from ..sealing import exact
from . import gate

__all__ = [
    "AsyncRespawnSaver",
    "GraphRunner",
    "RespawnSaver",
    "ThreadLeaseLost",
    "graph_agent",
    "session_id_for",
]

# Thread ids that are not UUIDs map to session ids in this namespace (uuid5).
THREAD_NAMESPACE = uuid.UUID("6f1c8f0e-3c55-4c3e-9a4e-2d1f0b7f5a10")
STANDALONE_OWNER = "langgraph:"  # lease owners of savers that are not a worker's run
GRAPH_STATE_VERSION = 1  # version of the graph summary a Respawn checkpoint carries
SUMMARY_CHARS = 200


class ThreadLeaseLost(LeaseLost):
    """This writer does not hold the thread's lease (another writer superseded it, or a
    worker runs the thread); the refused write wrote nothing."""


def session_id_for(thread_id: str) -> uuid.UUID:
    """The session of a LangGraph thread: the thread id itself when it is a UUID in its
    canonical form (a session started from the dashboard or API), else derived from it."""
    return session_id_in(THREAD_NAMESPACE, thread_id, what="thread_id")


# --- Django, for a LangGraph program that is not a Django project ------------------------


def _database_alias(conn_string: str) -> str:
    """The Django database alias for `conn_string`: "default" when it is the project's
    own database, else an alias added for it."""
    from django.db import connections

    from config.database_url import parse_database_url

    ensure_django(conn_string)
    # libpq's multi-host form too: DATABASE_URL's own reading (config.database_url).
    wanted = parse_database_url(conn_string, name="conn_string")
    key = ("ENGINE", "NAME", "HOST", "PORT", "USER")
    for alias in connections:
        current = connections.settings[alias]
        if all(str(current.get(k) or "") == str(wanted.get(k) or "") for k in key):
            return alias
    alias = "langgraph_" + uuid.uuid5(THREAD_NAMESPACE, conn_string).hex[:12]
    base = dict(connections.settings["default"])
    base.update(wanted)
    connections.settings[alias] = base
    return alias


# --- summaries a person reads in the trace ----------------------------------------------


def _short(text: str) -> str:
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"


def _summary(value: Any) -> str:
    """One line for a channel value or a write: a message's role and text, a list's length
    and last item, else a shortened repr."""
    content = getattr(value, "content", None)
    if content is not None and hasattr(value, "type"):
        text = content if isinstance(content, str) else json.dumps(content, default=str)
        calls = getattr(value, "tool_calls", None) or []
        names = ", ".join(c.get("name", "?") for c in calls if isinstance(c, dict))
        return _short(f"{value.type}: {text}" + (f" [calls {names}]" if names else ""))
    if isinstance(value, list | tuple):
        if not value:
            return "[]"
        return _short(f"{len(value)} item(s); last: {_summary(value[-1])}")
    if isinstance(value, str):
        return _short(value)
    return _short(repr(value))


def _model_of(values: Any) -> str:
    """The model an AI message among these writes names (its response metadata, as the
    LangChain chat models record it), for the session's header; "" if none does."""
    for value in values:
        for message in value if isinstance(value, list | tuple) else [value]:
            if getattr(message, "type", None) != "ai":
                continue
            metadata = getattr(message, "response_metadata", None) or {}
            name = metadata.get("model_name") or metadata.get("model")
            if isinstance(name, str) and name:
                return name[:200]
    return ""


def _node_of(task_id: str, task_path: str) -> str:
    if task_path:
        return task_path.split(", ")[-1] if task_path.startswith("~__pregel_pull") else task_path
    return "input" if task_id.strip("0-") == "" else task_id


def _json_safe(value: Any, what: str, *, sealable: bool = False) -> Any:
    """A checkpoint's body or metadata as JSON. PostgreSQL's jsonb holds no NUL character:
    such a value is refused, never changed (channel values with one are stored as blobs),
    unless it is `sealable` (stored sealed, exactly: sessions_app.sealing)."""
    text = json.dumps(value, default=str)
    if not sealable and _NUL_ESCAPE.search(text):
        raise ValueError(
            f"{what} holds a NUL character (\\x00), which PostgreSQL's jsonb "
            "cannot store; nothing was written"
        )
    return json.loads(text)


def _inline(value: Any) -> bool:
    """Whether a channel value goes in the checkpoint's body (jsonb) rather than a blob:
    a scalar that jsonb stores exactly (a string with a NUL or a lone surrogate does not)
    and that holds no secret (a blob with one is stored encrypted)."""
    if isinstance(value, str):
        return _UNSTORABLE.search(value) is None and _redactor().text(value) == value
    if isinstance(value, float):
        # jsonb writes 1e+23 out as an integer of another value.
        return "e+" not in repr(value)
    return value is None or isinstance(value, _SCALARS)


def _redaction() -> Any:
    """sessions_app.redaction, imported once Django is set up (its fields need the app)."""
    from .. import redaction

    return redaction


def _seal_blob(kind: str, data: bytes | None) -> tuple[str, bytes | None]:
    return _redaction().sealed_blob(kind, data)


def _open_blob(kind: str, data: bytes) -> tuple[str, bytes]:
    return _redaction().opened_blob(kind, data)


# --- the saver ---------------------------------------------------------------------------


def _on_own_connection(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run a saver method on the saver's own connection: LangGraph calls a checkpointer
    from its task threads, and Django keeps a connection per thread; the calling thread
    borrows the saver's one connection (closed by `close()`) for the call, one thread at a
    time, so the saver is one writer and never inside a transaction of the caller's."""

    @functools.wraps(method)
    def wrapper(self: RespawnSaver, *args: Any, **kwargs: Any) -> Any:
        return self._own.call(method, self, *args, **kwargs)

    return wrapper


class RespawnSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer on Respawn's tables. Sync methods for `graph.invoke`,
    async ones (their database work off the event loop) for `await graph.ainvoke`.

    database: the Django alias to write through (from_conn_string picks it).
    agent: the agent name of sessions this saver starts (name a `graph_agent` to let
    the workers resume and run those threads from the dashboard). The default,
    "langgraph", says the program runs them: the deploy gate leaves them to it.
    lease: a worker's lease: the saver writes only that session, under that lease.
    lease_ttl: how long a standalone saver's lease outlives its last write (on PostgreSQL
    at least half of it: a write renews the lease once half of it is gone).
    """

    def __init__(
        self,
        *,
        database: str = "default",
        agent: str = gate.CHECKPOINTER_AGENT,
        lease: Lease | None = None,
        lease_ttl: float = 30.0,
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(serde=serde)
        ensure_django()
        self._db = database
        self._agent = agent
        self._bound = lease
        self._ttl = lease_ttl
        self._owner = (
            lease.owner
            if lease is not None
            # os.urandom, not uuid4: a program (LangGraph's own tests) may patch uuid4 to a
            # fixed sequence that a saver's construction must not consume.
            else f"{STANDALONE_OWNER}{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"
        )
        self._lock = threading.RLock()
        self._leases: dict[uuid.UUID, Lease] = {}
        # Which lease token wrote a checkpoint (this process): a write that continues a
        # chain this saver wrote must carry that lease, and is refused once it is gone.
        self._chains: dict[tuple[uuid.UUID, str, str], int] = {}
        # The checkpoint get_tuple returned as a thread's latest: a run that read it and
        # finds the thread moved on when it takes the lease was raced by another writer.
        self._read_latest: dict[tuple[uuid.UUID, str], str] = {}
        # The last list stored per channel, to store the next version as what was added.
        # With the versions of its chain: (version, length), from the one stored whole.
        self._lists: dict[tuple[uuid.UUID, str, str], _ListChain] = {}
        self._own = OwnConnection("respawn-saver", database)
        self.cancel_requested = False  # a bound saver's put saw the session's cancel

    # -- construction, as the official savers have -------------------------------------
    @classmethod
    @contextmanager
    def from_conn_string(cls, conn_string: str, **kwargs: Any) -> Iterator[RespawnSaver]:
        """A saver writing to the Respawn database at `conn_string`."""
        saver = cls(database=_database_alias(conn_string), **kwargs)
        try:
            yield saver
        finally:
            saver.close()

    @_on_own_connection
    def setup(self) -> None:
        """Create or upgrade Respawn's tables (Django's migrate, idempotent)."""
        from django.core.management import call_command

        call_command("migrate", database=self._db, interactive=False, verbosity=0)

    def close(self) -> None:
        """Close the saver's database connection."""
        self._own.close()

    # -- versions: zero-padded, so they sort as strings ------------------------------------
    def get_next_version(self, current: str | None, channel: None = None) -> str:
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

    # -- the lease -----------------------------------------------------------------------
    def _lease_for(
        self, session_id: uuid.UUID, ns: str, parent_id: str | None
    ) -> tuple[Lease | None, bool]:
        """The lease a write must carry, and whether the write continues a chain this saver
        wrote (then a refusal is final: its run was superseded)."""
        if self._bound is not None:
            if str(self._bound.session_id) != str(session_id):
                raise ThreadLeaseLost(
                    f"this saver writes only session {self._bound.session_id} (its worker's "
                    f"run), not session {session_id}"
                )
            return self._bound, True
        with self._lock:
            lease = self._leases.get(session_id)
            token = self._chains.get((session_id, ns, parent_id)) if parent_id else None
            if token is not None:
                if lease is None or lease.token != token:
                    raise ThreadLeaseLost(
                        f"thread of session {session_id}: this writer's run (lease token "
                        f"{token}) was superseded by another writer; nothing was written"
                    )
                return lease, True
            return lease, False

    def _claim(self, session_id: uuid.UUID, thread_id: str, ns: str, parent_id: str | None):
        from django.db import transaction
        from django.db.models.functions import Now
        from django.utils import timezone

        from ..models import AgentSession, GraphThread

        now = timezone.now()
        with transaction.atomic(using=self._db):
            session = (
                AgentSession.objects.using(self._db)
                .select_for_update()
                .annotate(db_now=Now())
                .filter(id=session_id)
                .first()
            )
            if session is None:
                session = self._create_thread(session_id, thread_id, now)
            if not GraphThread.objects.using(self._db).filter(session=session).exists():
                raise ValueError(
                    f"thread_id {thread_id!r} names session {session_id}, which is not a "
                    "LangGraph thread (its agent is not a graph)"
                )
            owner = session.lease_owner or ""
            # Whether a lease is live, on the database's clock (as leases are kept).
            if session.lease_is_live(session.db_now) and not owner.startswith(STANDALONE_OWNER):
                raise ThreadLeaseLost(
                    f"thread {thread_id!r} is being run by worker {owner} (lease until "
                    f"{session.lease_expires_at:%H:%M:%S}); a second writer cannot write it"
                )
            read = self._read_latest.get((session_id, ns))
            if parent_id is not None and read == parent_id:
                latest = self._latest(session_id, ns)
                if latest is not None and latest.checkpoint_id != parent_id:
                    raise ThreadLeaseLost(
                        f"thread {thread_id!r} moved on from checkpoint {parent_id} to "
                        f"{latest.checkpoint_id} since this writer read it: another writer "
                        "wrote it; nothing was written (read the thread again)"
                    )
            lease = _store().take_lease(session, self._owner, self._ttl, using=self._db)
        with self._lock:
            self._leases[session_id] = lease
        return lease

    def _new_session(self, session_id: uuid.UUID, thread_id: str, now: Any) -> Any:
        """A new thread's session (not saved)."""
        from ..models import AgentSession, Status

        return AgentSession(
            id=session_id,
            agent=self._agent,
            title=_short(f"LangGraph thread {thread_id}"),
            # Between the application's calls the thread waits for its next input.
            status=Status.WAITING_INPUT,
            created_at=now,
            updated_at=now,
        )

    def _create_thread(self, session_id: uuid.UUID, thread_id: str, now: Any) -> Any:
        """The thread's session, created unless another writer just did; locked."""
        from django.db import IntegrityError, transaction
        from django.db.models.functions import Now

        from ..models import AgentSession

        try:
            with transaction.atomic(using=self._db):
                session = self._new_session(session_id, thread_id, now)
                session.save(using=self._db, force_insert=True)
                _graph_rows().new_thread(session, thread_id, using=self._db)
        except IntegrityError:
            pass  # another process created it first
        return (
            AgentSession.objects.using(self._db)
            .select_for_update()
            .annotate(db_now=Now())
            .get(id=session_id)
        )

    def _fenced(
        self,
        lease: Lease,
        *,
        head: bool,
        write: Callable[[Any, tuple[str, str]], None],
        rows: dict[str, Any] | None,
        answer: str | None = None,
    ) -> int:
        """One transaction: advance the session's seq on (token, owner) (and set its
        final answer, with `answer`), then `write`. On PostgreSQL, given `rows`, one
        statement does it all (store/graph.py's `fenced_write`): one round trip, one
        commit."""
        from django.db import transaction

        # A worker's run keeps its lease by the heartbeat; a program's saver by its writes.
        now = _now()
        if rows is not None and self._vendor() == "postgresql":
            done = _graph_rows().fenced_write(
                lease,
                using=self._db,
                head=head,
                # On the database's clock, as every lease (a program's clock may be off).
                lease_ttl=self._ttl if self._bound is None else None,
                # Renewed once half of it is gone: most writes leave the session row's
                # indexed columns alone (a HOT update).
                renew_within=self._ttl / 2,
                final_answer=answer,
                now=now,
                **rows,
            )
            if done is None:
                raise ThreadLeaseLost(self._refusal(lease))
            seq, cancel = done
            if cancel and self._bound is not None:
                self.cancel_requested = True
                raise RunnerCancelled(f"session {lease.session_id}: cancel requested")
            return seq
        expires = now + timedelta(seconds=self._ttl) if self._bound is None else None
        with transaction.atomic(using=self._db):
            row = _store().advance_held(
                lease, using=self._db, head=head, expires=expires, final_answer=answer
            )
            if row is None:
                raise ThreadLeaseLost(self._refusal(lease))
            seq, cancel, agent, agent_version = row
            write(seq, (agent, agent_version))
        if cancel and self._bound is not None:
            self.cancel_requested = True
            raise RunnerCancelled(f"session {lease.session_id}: cancel requested")
        return seq

    def _create_with(
        self,
        session_id: uuid.UUID,
        thread_id: str,
        *,
        head: bool,
        rows: dict[str, Any],
        answer: str | None,
    ) -> Lease | None:
        """A new thread's first write on PostgreSQL in one statement: its session created
        holding this writer's lease (as `_claim` leaves it after `_create_thread`), its
        thread row, and the write at seq 1. None, having written nothing, when the session
        is there already (then `_claim` finds out whether this writer may write it)."""
        from ..models import AgentSession

        now = _now()
        token = AgentSession._meta.get_field("fencing_token").get_default() + 1
        session = self._new_session(session_id, thread_id, now)
        session.last_seq = session.step_count = 1
        session.head = 1 if head else 0
        session.final_answer = answer or ""
        lease = Lease(str(session_id), self._owner, token)
        done = _graph_rows().fenced_write(
            lease,
            using=self._db,
            head=head,
            lease_ttl=self._ttl,  # from the database's clock
            final_answer=None,
            now=now,
            create=_graph_rows().NewThread(session, thread_id),
            **rows,
        )
        if done is None:
            return None
        with self._lock:
            self._leases[session_id] = lease
        return lease

    def _refusal(self, lease: Lease) -> str:
        from ..models import AgentSession

        now = AgentSession.objects.using(self._db).filter(id=lease.session_id).first()
        if now is None:
            return f"session {lease.session_id} is gone (deleted); nothing was written"
        return (
            f"session {lease.session_id}: this writer's lease (token {lease.token}) was "
            f"superseded by {now.lease_owner or 'an operator action'} (token "
            f"{now.fencing_token}); nothing was written"
        )

    def _write(
        self,
        thread_id: str,
        ns: str,
        parent_id: str | None,
        *,
        head: bool,
        write: Callable[[Any, tuple[str, str]], None],
        rows: dict[str, Any] | None,
        answer: str | None = None,
    ) -> tuple[Lease, int]:
        session_id = session_id_for(thread_id)
        lease, continuing = self._lease_for(session_id, ns, parent_id)
        if (
            lease is None
            and parent_id is None
            and rows is not None
            and self._vendor() == "postgresql"
        ):
            # A new thread's first write (it names no parent): one statement, unless the
            # session is there already.
            created = self._create_with(session_id, thread_id, head=head, rows=rows, answer=answer)
            if created is not None:
                return created, 1
        if lease is not None:
            try:
                return lease, self._fenced(lease, head=head, write=write, rows=rows, answer=answer)
            except ThreadLeaseLost:
                if continuing:
                    raise
                # A new run of this saver on a thread another writer took since: take it back.
        # The claim and the write in one transaction: the session row stays locked until
        # the write commits, so a writer racing this one sees the thread moved on.
        from django.db import transaction

        with transaction.atomic(using=self._db):
            lease = self._claim(session_id, thread_id, ns, parent_id)
            return lease, self._fenced(lease, head=head, write=write, rows=rows, answer=answer)

    # -- writing -------------------------------------------------------------------------
    @_on_own_connection
    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        configurable = config["configurable"]
        thread_id = configurable["thread_id"]
        ns = configurable.get("checkpoint_ns", "")
        parent_id = configurable.get("checkpoint_id")
        session_id = session_id_for(thread_id)
        body = {k: v for k, v in checkpoint.items() if k not in ("channel_values", "pending_sends")}
        inline, blobs, lists = self._split_values(session_id, ns, checkpoint, new_versions)
        body["channel_values"] = inline
        body = _json_safe(body, "the checkpoint")
        meta = _json_safe(
            get_serializable_checkpoint_metadata(config, metadata),
            "the checkpoint's metadata",
            sealable=True,
        )
        # Stored sealed when it holds a secret: masked where people and filters see it,
        # exact when a run reads it back.
        stored_meta = _redaction().sealed(meta)
        changed = {
            ch: _summary(checkpoint["channel_values"][ch])
            for ch in sorted(new_versions)
            if ch in checkpoint["channel_values"] and not ch.startswith("branch:")
        }
        db = self._db
        payload = {
            "event": "graph_checkpoint",
            "checkpoint_id": checkpoint["id"],
            "ns": ns,
            "step": meta.get("step"),
            "source": meta.get("source"),
            "changed": changed,
        }
        # The thread's answer so far: its last message, when the model wrote it and asked
        # for no tool (what the graph's caller shows its user).
        answer = _reply(checkpoint["channel_values"]) if ns == "" else None
        summary = _redact(
            {
                "checkpoint_id": checkpoint["id"],
                "ns": ns,
                "parent_id": parent_id,
                "step": meta.get("step"),
                "source": meta.get("source"),
                "channel_versions": body.get("channel_versions", {}),
                "changed": changed,
            }
        )

        def state_of(seq: int, agent: tuple[str, str]) -> dict[str, Any]:
            state = SessionState(agent_name=agent[0], agent_version=agent[1], final_answer=answer)
            state.counters.steps = seq
            state.agent_state = {"version": GRAPH_STATE_VERSION, "data": {"langgraph": summary}}
            return state.to_dict()

        # The graph checkpoint and its new values, as either way of writing takes them.
        graph_rows = {
            "ns": ns,
            "checkpoint_id": checkpoint["id"],
            "parent_id": parent_id,
            "body": body,
            "metadata": stored_meta,
            "blobs": blobs,
        }

        def write(seq: int, agent: tuple[str, str]) -> None:
            now = _system_step(db, session_id, seq, payload)
            _store().add_checkpoint(session_id, state_of(seq, agent), seq=seq, using=db, now=now)
            _graph_rows().put_checkpoint(using=db, session_id=session_id, seq=seq, **graph_rows)

        # On PostgreSQL the same rows in one statement; the agent and the step count of
        # the state come from the session row the fence advances. Not for a state stored
        # sealed (an answer that shows a secret): its exact copy is out of the statement's
        # reach, so it is written by `write`, with the row's values known.
        state = _redaction().fillable_json(state_of(0, ("", "")), _store().FILLED_FROM_THE_ROW)
        rows = None
        if state is not None:
            rows = {
                "payload": payload,
                "checkpoint": _graph_rows().CheckpointRows(state=state, **graph_rows),
            }
        lease, _ = self._write(
            thread_id, ns, parent_id, head=ns == "", write=write, rows=rows, answer=answer
        )
        with self._lock:
            self._chains[(session_id, ns, checkpoint["id"])] = lease.token
            self._lists.update(lists)
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    def _split_values(
        self,
        session_id: uuid.UUID,
        ns: str,
        checkpoint: Checkpoint,
        new_versions: ChannelVersions,
    ) -> tuple[dict[str, Any], list[tuple], dict]:
        """Primitive values inline in the checkpoint body; the others as blobs of their new
        versions, a list that extends the one this saver stored last as what was added."""
        values = checkpoint["channel_values"]
        # Small scalars go in the body, as PostgresSaver keeps them.
        inline = {k: v for k, v in values.items() if _inline(v)}
        blobs: list[tuple] = []
        lists: dict[tuple[uuid.UUID, str, str], _ListChain] = {}
        for channel, version in new_versions.items():
            version = str(version)
            if channel not in values:
                blobs.append((channel, version, "empty", None, None))
                continue
            value = values[channel]
            if channel in inline:
                continue
            base = None
            if isinstance(value, list):
                key = (session_id, ns, channel)
                previous = self._lists.get(key)
                chain = [(version, len(value))]
                if (
                    previous is not None
                    and previous.version != version
                    and previous.items
                    and len(value) >= len(previous.items)
                    # The same objects, not equal ones: a reducer appended to the list.
                    and all(a is b for a, b in zip(previous.items, value, strict=False))
                ):
                    # The k-th version after the whole one builds on the (k & (k - 1))-th,
                    # as a Fenwick tree does: a reader loads at most log2(k) + 1 versions,
                    # which hold the list's items once; each item is stored about
                    # log2(k) / 2 times.
                    k = len(previous.chain)
                    base, length = previous.chain[k & (k - 1)]
                    kind, data = _seal_blob(*self.serde.dumps_typed(value[length:]))
                    chain = [*previous.chain, *chain]
                lists[key] = _ListChain(version, list(value), chain)
            if base is None:
                kind, data = _seal_blob(*self.serde.dumps_typed(value))
            blobs.append((channel, version, kind, data, base))
        return inline, blobs, lists

    @_on_own_connection
    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        configurable = config["configurable"]
        thread_id = configurable["thread_id"]
        ns = configurable.get("checkpoint_ns", "")
        checkpoint_id = configurable["checkpoint_id"]
        session_id = session_id_for(thread_id)
        special = all(channel in WRITES_IDX_MAP for channel, _ in writes)
        rows = []
        for index, (channel, value) in enumerate(writes):
            kind, data = _seal_blob(*self.serde.dumps_typed(value))
            rows.append((WRITES_IDX_MAP.get(channel, index), channel, kind, data))
        payload = {
            "event": "graph_writes",
            "node": _node_of(task_id, task_path),
            "task_id": task_id,
            "checkpoint_id": checkpoint_id,
            "ns": ns,
            "writes": [{"channel": c, "value": _summary(v)} for c, v in writes],
        }
        model = _model_of(v for _, v in writes)
        if model:
            payload["model"] = model
        db = self._db

        def write(seq: int, agent: tuple[str, str]) -> None:
            _system_step(db, session_id, seq, payload)
            _graph_rows().put_writes(
                using=db,
                session_id=session_id,
                ns=ns,
                checkpoint_id=checkpoint_id,
                task_id=task_id,
                task_path=task_path,
                seq=seq,
                rows=rows,
                # Errors, interrupts, resumes: the latest one counts.
                replace=special,
            )

        one_statement = {
            "payload": payload,
            "writes": _graph_rows().WriteRows(
                ns=ns,
                checkpoint_id=checkpoint_id,
                task_id=task_id,
                task_path=task_path,
                rows=rows,
                replace=special,
            ),
        }
        self._write(thread_id, ns, checkpoint_id, head=False, write=write, rows=one_statement)

    # -- reading -------------------------------------------------------------------------
    def _latest(self, session_id: uuid.UUID, ns: str):
        """The thread's latest checkpoint in `ns`: the newest whose step no rollback
        superseded."""
        return (
            _with_superseded(self._checkpoints(session_id, ns)).order_by("-checkpoint_id").first()
        )

    def _checkpoints(self, session_id: uuid.UUID, ns: str, *, live: bool = True):
        from django.db.models import Exists

        from ..models import GraphCheckpoint

        qs = GraphCheckpoint.objects.using(self._db).filter(session_id=session_id, ns=ns)
        if live:
            qs = qs.exclude(Exists(_superseded_step()))
        return qs

    @_on_own_connection
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        from ..models import GraphCheckpoint

        configurable = config["configurable"]
        thread_id = configurable["thread_id"]
        ns = configurable.get("checkpoint_ns", "")
        session_id = session_id_for(thread_id)
        checkpoint_id = get_checkpoint_id(config)
        if self._vendor() == "postgresql":
            return self._get_tuple_at_once(thread_id, session_id, ns, checkpoint_id)
        if checkpoint_id:
            row = _with_superseded(
                GraphCheckpoint.objects.using(self._db).filter(
                    session_id=session_id, ns=ns, checkpoint_id=checkpoint_id
                )
            ).first()
        else:
            row = self._latest(session_id, ns)
            if row is not None:
                with self._lock:
                    self._read_latest[(session_id, ns)] = row.checkpoint_id
        if row is None:
            return None
        return self._tuples([(thread_id, row)])[0]

    def _get_tuple_at_once(
        self, thread_id: str, session_id: uuid.UUID, ns: str, checkpoint_id: str | None
    ) -> CheckpointTuple | None:
        """get_tuple on PostgreSQL in one statement (`_read_at_once`): the checkpoint named,
        or the latest whose step no rollback superseded."""
        where = "c.session_id = %s AND c.ns = %s"
        params: builtins.list[Any] = [session_id, ns]
        if checkpoint_id:
            where += " AND c.checkpoint_id = %s"
            params.append(checkpoint_id)
        else:
            where += " AND NOT " + _SUPERSEDED.format(t="c")
        tuples = self._read_at_once(where, params, limit=1, one_thread=True)
        if not tuples:
            return None
        if not checkpoint_id:
            with self._lock:
                self._read_latest[(session_id, ns)] = tuples[0].config["configurable"][
                    "checkpoint_id"
                ]
        return tuples[0]

    def _read_at_once(
        self,
        where: str,
        params: builtins.list[Any],
        *,
        limit: int | None,
        one_thread: bool = False,
    ) -> builtins.list[CheckpointTuple]:
        """The tuples of the graph checkpoints `where` picks (newest first, at most
        `limit`), in one statement on PostgreSQL, as PostgresSaver reads them: the
        checkpoints (with their thread ids and whether a rollback superseded their
        steps), the values they need (with the earlier versions of a list stored as
        what each version appended, down to a whole one) and their pending writes.
        `one_thread`: `where` names one session and one ns, whose checkpoint ids are
        unique (then the newest are read straight off the index, without a sort)."""
        from ..models import GraphBlob, GraphCheckpoint, GraphThread, GraphWrite
        from ..store import postgresql

        blob = GraphBlob._meta.db_table
        # Within one thread and ns a checkpoint id is unique (graphcp_session_ns_id): the
        # index gives them in order, and LIMIT 1 reads one row. Sorting on the id as well
        # made PostgreSQL read and sort the first 32 rows at least (an incremental sort's
        # first batch), each joined and checked for a rollback, before returning one.
        order = "c.checkpoint_id DESC" + ("" if one_thread else ", c.id DESC")
        sql = (
            "WITH RECURSIVE cp AS (SELECT c.id, c.session_id, c.ns, c.checkpoint_id,"
            f" c.parent_id, c.seq, c.body, c.metadata, {_SUPERSEDED.format(t='c')} AS superseded"
            f" FROM {GraphCheckpoint._meta.db_table} c"
            f" WHERE {where} ORDER BY {order}" + (" LIMIT %s" if limit is not None else "") + "),"
            " wanted AS (SELECT DISTINCT cp.session_id, cp.ns, v.key AS channel,"
            " v.value #>> '{}' AS version"
            " FROM cp, jsonb_each(cp.body -> 'channel_versions') AS v"
            " WHERE NOT coalesce(cp.body -> 'channel_values', '{}'::jsonb) ? v.key),"
            # The versions wanted and, of a list stored as what versions appended, the
            # versions they build on, down to a whole one. Each looked up by its key in
            # the index (LATERAL ... LIMIT 1: a version is unique): joined as sets, the
            # planner, counting a hundred rows for jsonb_each, read the whole table.
            " links AS (SELECT b.session_id, b.ns, b.channel, b.version, b.base_version"
            f" FROM wanted w CROSS JOIN LATERAL (SELECT * FROM {blob} b"
            " WHERE b.session_id = w.session_id AND b.ns = w.ns AND b.channel = w.channel"
            " AND b.version = w.version LIMIT 1) b"
            " UNION SELECT b.session_id, b.ns, b.channel, b.version, b.base_version"
            f" FROM links o CROSS JOIN LATERAL (SELECT * FROM {blob} b"
            " WHERE b.session_id = o.session_id AND b.ns = o.ns AND b.channel = o.channel"
            " AND b.version = o.base_version LIMIT 1) b)"
            " SELECT 'c', cp.session_id, cp.ns, cp.checkpoint_id, cp.parent_id, t.thread_id,"
            " NULL::text, cp.seq, row_number() OVER (ORDER BY cp.checkpoint_id DESC, cp.id DESC),"
            " cp.body, cp.metadata, cp.superseded, NULL::text, NULL::bytea"
            f" FROM cp JOIN {GraphThread._meta.db_table} t ON t.session_id = cp.session_id"
            " UNION ALL SELECT 'b', b.session_id, b.ns, b.channel, b.version, b.base_version,"
            " NULL, NULL, NULL, NULL, NULL, NULL, b.type, b.blob FROM links l"
            f" CROSS JOIN LATERAL (SELECT * FROM {blob} b WHERE b.session_id = l.session_id"
            " AND b.ns = l.ns AND b.channel = l.channel AND b.version = l.version LIMIT 1) b"
            " UNION ALL SELECT 'w', w.session_id, w.ns, w.task_id, w.channel, w.task_path,"
            f" w.checkpoint_id, w.seq, w.idx, NULL, NULL, {_SUPERSEDED.format(t='w')},"
            f" w.type, w.blob FROM {GraphWrite._meta.db_table} w JOIN cp"
            " ON w.session_id = cp.session_id AND w.ns = cp.ns"
            " AND w.checkpoint_id = cp.checkpoint_id"
        )
        params = [*params, *([limit] if limit is not None else [])]
        # Prepared once per connection and shape: the statement is long to plan.
        fetched = postgresql.fetch_all(sql, params, using=self._db)
        checkpoints: builtins.list[tuple[int, str, _CheckpointRow]] = []
        found: dict[tuple[Any, str, str, str], _BlobRow] = {}
        writes: dict[tuple[Any, str, str], builtins.list[_WriteRow]] = {}
        for kind, sid, ns, a, b, c, d, n, order, body, meta, flag, type_, data in fetched:
            if kind == "c":
                row = _CheckpointRow(
                    session_id=sid,
                    ns=ns,
                    checkpoint_id=a,
                    parent_id=b,
                    seq=n,
                    body=json.loads(body) if isinstance(body, str) else body,
                    metadata=json.loads(meta) if isinstance(meta, str) else meta,
                    superseded=flag,
                )
                checkpoints.append((order, c, row))
            elif kind == "b":
                found[(sid, ns, a, b)] = _BlobRow(a, b, type_, data, c)
            else:
                writes.setdefault((sid, ns, d), []).append(
                    _WriteRow(
                        task_id=a,
                        channel=b,
                        seq=n,
                        superseded=flag,
                        type=type_,
                        blob=data,
                        task_path=c,
                        idx=order,
                    )
                )
        checkpoints.sort(key=lambda item: item[0])
        values = _Values(self)
        values.fill([row for _, _, row in checkpoints], found)
        out = []
        for _, thread_id, row in checkpoints:
            mine = writes.get((row.session_id, row.ns, row.checkpoint_id), [])
            if not row.superseded:
                # A rollback to this checkpoint dropped the writes made after it: its
                # tasks run again.
                mine = [w for w in mine if not w.superseded]
            out.append(self._tuple_of(thread_id, row, values, mine))
        return out

    def _tuple(self, thread_id: str, row: Any) -> CheckpointTuple:
        return self._tuples([(thread_id, row)])[0]

    def _tuples(self, rows: Sequence[tuple[str, Any]]) -> builtins.list[CheckpointTuple]:
        """The tuples of these checkpoint rows (with their thread ids), read together: one
        read of their channel values (two for lists stored as what was appended) and one
        of their pending writes, however many checkpoints there are."""
        from django.db.models import Exists, Q

        from ..models import GraphWrite

        if not rows:
            return []
        values = _Values(self)
        values.prefetch([row for _, row in rows])
        ids: dict[tuple[Any, str], set[str]] = {}
        for _, row in rows:
            ids.setdefault((row.session_id, row.ns), set()).add(row.checkpoint_id)
        match = Q()
        for (session_id, ns), checkpoint_ids in ids.items():
            match |= Q(session_id=session_id, ns=ns, checkpoint_id__in=checkpoint_ids)
        writes: dict[tuple[Any, str, str], builtins.list[Any]] = {}
        for w in (
            GraphWrite.objects.using(self._db)
            .filter(match)
            .annotate(superseded=Exists(_superseded_step()))
        ):
            writes.setdefault((w.session_id, w.ns, w.checkpoint_id), []).append(w)
        out = []
        for thread_id, row in rows:
            mine = writes.get((row.session_id, row.ns, row.checkpoint_id), [])
            if not row.superseded:
                # A rollback to this checkpoint dropped the writes made after it: its
                # tasks run again.
                mine = [w for w in mine if not w.superseded]
            out.append(self._tuple_of(thread_id, row, values, mine))
        return out

    def _tuple_of(
        self, thread_id: str, row: Any, values: _Values, writes: builtins.list[Any]
    ) -> CheckpointTuple:
        body: Checkpoint = row.body.copy()  # as put() stored it, less the channel values
        channel_values = dict(body.get("channel_values") or {})
        channel_values.update(
            values.load(row.session_id, row.ns, body.get("channel_versions") or {}, channel_values)
        )
        body["channel_values"] = channel_values
        # The type column allows NULL, though no write this saver makes has none; the
        # serializer refuses a type it does not know either way.
        pending = [
            (w.task_id, w.channel, self.serde.loads_typed(_open_blob(w.type or "", bytes(w.blob))))
            for w in sorted(writes, key=lambda w: (w.task_path, w.task_id, w.idx))
        ]
        parent: RunnableConfig | None = (
            {
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": row.ns,
                    "checkpoint_id": row.parent_id,
                }
            }
            if row.parent_id
            else None
        )
        return CheckpointTuple(
            config={
                "configurable": {
                    "thread_id": thread_id,
                    "checkpoint_ns": row.ns,
                    "checkpoint_id": row.checkpoint_id,
                }
            },
            checkpoint=body,
            metadata=exact(row.metadata),
            parent_config=parent,
            pending_writes=pending,
        )

    @_on_own_connection
    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        # Read whole on the saver's connection, handed out as an iterator.
        from django.db.models import F

        if self._vendor() == "postgresql":
            where = ["TRUE"]
            params: builtins.list[Any] = []
            one_thread = False
            if config is not None:
                configurable = config["configurable"]
                where.append("c.session_id = %s")
                params.append(session_id_for(configurable["thread_id"]))
                if configurable.get("checkpoint_ns") is not None:
                    where.append("c.ns = %s")
                    params.append(configurable["checkpoint_ns"])
                    one_thread = True
                if configurable.get("checkpoint_id"):
                    where.append("c.checkpoint_id = %s")
                    params.append(configurable["checkpoint_id"])
            if filter:
                where.append("c.metadata @> %s::jsonb")
                params.append(json.dumps(_json_safe(filter, "the list filter")))
            if before is not None and get_checkpoint_id(before):
                where.append("c.checkpoint_id < %s")
                params.append(get_checkpoint_id(before))
            return iter(
                self._read_at_once(" AND ".join(where), params, limit=limit, one_thread=one_thread)
            )

        from ..models import GraphCheckpoint

        # The thread id joined in, not the session row: a list reads hundreds of rows.
        qs = GraphCheckpoint.objects.using(self._db).annotate(
            thread_id=F("session__graph_thread__thread_id")
        )
        if config is not None:
            configurable = config["configurable"]
            qs = qs.filter(session_id=session_id_for(configurable["thread_id"]))
            if configurable.get("checkpoint_ns") is not None:
                qs = qs.filter(ns=configurable["checkpoint_ns"])
            if configurable.get("checkpoint_id"):
                qs = qs.filter(checkpoint_id=configurable["checkpoint_id"])
        python_filter = None
        if filter:
            if self._vendor() == "postgresql":
                qs = qs.filter(metadata__contains=_json_safe(filter, "the list filter"))
            else:
                python_filter = _json_safe(filter, "the list filter")
        if before is not None and get_checkpoint_id(before):
            qs = qs.filter(checkpoint_id__lt=get_checkpoint_id(before))
        qs = _with_superseded(qs).order_by("-checkpoint_id", "-id")
        if limit is not None and python_filter is None:
            qs = qs[:limit]
        rows = []
        for row in qs:
            if python_filter is not None and any(
                row.metadata.get(k) != v for k, v in python_filter.items()
            ):
                continue
            rows.append((row.thread_id, row))
            if limit is not None and len(rows) >= limit:
                break
        return iter(self._tuples(rows))

    def _vendor(self) -> str:
        from django.db import connections

        return connections[self._db].vendor

    # -- deleting and copying ------------------------------------------------------------
    @_on_own_connection
    def delete_thread(self, thread_id: str) -> None:
        """Delete the thread's session and everything in it; an audit record stays."""
        from django.db import transaction

        from ..models import AgentSession, AuditAction, AuditEvent

        session_id = session_id_for(thread_id)
        with transaction.atomic(using=self._db):
            session = AgentSession.objects.using(self._db).filter(id=session_id).first()
            if session is None:
                return
            AuditEvent.objects.using(self._db).create(
                actor_label="langgraph",
                action=AuditAction.GRAPH_DELETE_THREAD,
                session_id=session_id,
                before={"thread_id": thread_id, "steps": session.last_seq},
            )
            session.delete(using=self._db)
        self._forget(session_id)

    def _forget(self, session_id: uuid.UUID) -> None:
        with self._lock:
            self._leases.pop(session_id, None)
            caches: tuple[dict[Any, Any], ...] = (self._chains, self._read_latest, self._lists)
            for cache in caches:
                for key in [k for k in cache if k[0] == session_id]:
                    del cache[key]

    @_on_own_connection
    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) that the given runs wrote."""
        from django.db import transaction

        from ..models import GraphCheckpoint

        if not run_ids:
            return
        with transaction.atomic(using=self._db):
            rows = list(
                GraphCheckpoint.objects.using(self._db).filter(
                    metadata__run_id__in=[str(r) for r in run_ids]
                )
            )
            self._delete_checkpoints(rows)

    def _delete_checkpoints(self, rows: builtins.list[Any]) -> None:
        from ..models import AgentSession

        if not rows:
            return
        by_session: dict[Any, list[Any]] = {}
        for row in rows:
            by_session.setdefault(row.session_id, []).append(row)
        for session_id, group in by_session.items():
            _graph_rows().delete_checkpoints(session_id, group, using=self._db)
            # The head stays on a checkpoint that exists: the latest left, or none.
            latest = self._latest(session_id, "")
            AgentSession.objects.using(self._db).filter(id=session_id).update(
                head=latest.seq if latest is not None else 0
            )

    @_on_own_connection
    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """A new thread (session) with the source's steps, checkpoints, values and writes,
        linked to the source as a fork at its last step."""
        from django.db import transaction

        from ..models import AgentSession, AuditAction, AuditEvent, Status

        source_id = session_id_for(source_thread_id)
        target_id = session_id_for(target_thread_id)
        db = self._db
        with transaction.atomic(using=db):
            source = AgentSession.objects.using(db).select_for_update().filter(id=source_id).first()
            if source is None:
                return
            if AgentSession.objects.using(db).filter(id=target_id).exists():
                raise ValueError(
                    f"cannot copy thread {source_thread_id!r} to {target_thread_id!r}: the "
                    "target thread already exists"
                )
            now = _now()
            target = AgentSession.objects.using(db).create(
                id=target_id,
                agent=source.agent,
                agent_version=source.agent_version,
                title=_short(f"Copy of {source.title or source_thread_id}"),
                status=Status.WAITING_INPUT if source.status != Status.PAUSED else Status.PAUSED,
                head=source.head,
                last_seq=source.last_seq,
                step_count=source.step_count,
                parent=source,
                fork_seq=source.last_seq,
                created_at=now,
                updated_at=now,
            )
            _graph_rows().new_thread(target, target_thread_id, using=db)
            _graph_rows().copy_thread_rows(source_id, target_id, using=db)
            AuditEvent.objects.using(db).create(
                actor_label="langgraph",
                action=AuditAction.GRAPH_COPY_THREAD,
                session_id=target_id,
                before={"source_thread": source_thread_id, "source_session": str(source_id)},
                after={"thread_id": target_thread_id},
            )

    @_on_own_connection
    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """keep_latest: keep each namespace's latest checkpoint (and, for a graph with
        delta channels, its ancestors), with the values and writes it needs; delete:
        delete the threads."""
        from django.db import transaction

        from ..models import GraphBlob, GraphCheckpoint

        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}: keep_latest or delete")
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
                continue
            session_id = session_id_for(thread_id)
            with transaction.atomic(using=self._db):
                rows = list(GraphCheckpoint.objects.using(self._db).filter(session_id=session_id))
                keep: set[int] = set()
                by_ns: dict[str, list[Any]] = {}
                for row in rows:
                    by_ns.setdefault(row.ns, []).append(row)
                for group in by_ns.values():
                    by_id = {r.checkpoint_id: r for r in group}
                    latest = max(group, key=lambda r: r.checkpoint_id)
                    keep.add(latest.id)
                    if any("counters_since_delta_snapshot" in r.metadata for r in group):
                        parent = latest.parent_id
                        while parent in by_id and by_id[parent].id not in keep:
                            keep.add(by_id[parent].id)
                            parent = by_id[parent].parent_id
                self._delete_checkpoints([r for r in rows if r.id not in keep])
                # Values no kept checkpoint reaches (through a list's bases) go too.
                blobs = list(
                    GraphBlob.objects.using(self._db)
                    .filter(session_id=session_id)
                    .values_list("id", "ns", "channel", "version", "base_version")
                )
                by_key = {(ns, ch, v): (pk, base) for pk, ns, ch, v, base in blobs}
                needed: set[int] = set()
                for row in rows:
                    if row.id not in keep:
                        continue
                    for channel, version in (row.body.get("channel_versions") or {}).items():
                        key = (row.ns, channel, str(version))
                        while key in by_key and by_key[key][0] not in needed:
                            pk, base = by_key[key]
                            needed.add(pk)
                            if base is None:
                                break
                            key = (row.ns, channel, base)
                _graph_rows().delete_values_except(session_id, needed, using=self._db)
            with self._lock:
                for list_key in [k for k in self._lists if k[0] == session_id]:
                    del self._lists[list_key]

    # -- async: the same work on the saver's own connection, off the event loop ----------
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._own.run(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        items = await self._own.run(self.list, config, filter=filter, before=before, limit=limit)
        for item in items:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await self._own.run(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self._own.run(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await self._own.run(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._own.run(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._own.run(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._own.run(self.prune, thread_ids, strategy=strategy)


class AsyncRespawnSaver(RespawnSaver):
    """RespawnSaver for asyncio programs, shaped like AsyncPostgresSaver:

        async with AsyncRespawnSaver.from_conn_string(DATABASE_URL) as saver:
            await saver.setup()
            graph = builder.compile(checkpointer=saver)
            await graph.ainvoke(inputs, config)

    Every database call runs on the saver's own connection, never on the event loop."""

    @classmethod
    @asynccontextmanager
    async def from_conn_string(  # type: ignore[override]
        cls, conn_string: str, **kwargs: Any
    ) -> AsyncIterator[AsyncRespawnSaver]:
        saver = cls(database=await asyncio.to_thread(_database_alias, conn_string), **kwargs)
        try:
            yield saver
        finally:
            await saver.aclose()

    async def setup(self) -> None:
        await self._own.run(RespawnSaver.setup, self)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)


class _Values:
    """Channel values of checkpoints, loaded once per (channel, version): the values of
    many checkpoints in one read (and one more for lists stored as what was appended)."""

    def __init__(self, saver: RespawnSaver) -> None:
        self._saver = saver
        self._done: dict[tuple[Any, str, str, str], Any] = {}
        self._tried: set[tuple[Any, str, str, str]] = set()

    def prefetch(self, rows: Sequence[Any]) -> None:
        """Read the values every one of these checkpoint rows needs."""
        from django.db.models import Q

        from ..models import GraphBlob

        wanted = self._wanted(rows)
        if not wanted:
            return
        match = Q()
        for (session_id, ns, channel), versions in wanted.items():
            match |= Q(session_id=session_id, ns=ns, channel=channel, version__in=versions)
        blobs = GraphBlob.objects.using(self._saver._db)
        columns = ("session_id", "ns", "channel", "version", "type", "blob", "base_version")
        # Rows as tuples, not model instances: a long list's chain is hundreds of rows.
        found = {r[:4]: r for r in blobs.filter(match).values_list(*columns, named=True)}
        chains: dict[tuple[Any, str, str], str] = {}
        for key, r in found.items():
            if r.base_version is not None:
                chains[key[:3]] = max(chains.get(key[:3], ""), max(wanted[key[:3]]))
        if chains:
            # A list stored as what each version added: the channel's versions up to the
            # newest wanted (versions sort as strings).
            match = Q()
            for (session_id, ns, channel), newest in chains.items():
                match |= Q(session_id=session_id, ns=ns, channel=channel, version__lte=newest)
            for r in blobs.filter(match).values_list(*columns, named=True):
                found[r[:4]] = r
        self._resolve_all(wanted, found)

    def fill(self, rows: Sequence[Any], found: dict[tuple[Any, str, str, str], Any]) -> None:
        """The values these checkpoint rows need, from blob rows read already (`found`,
        by session, ns, channel and version)."""
        self._resolve_all(self._wanted(rows), found)

    def _wanted(self, rows: Sequence[Any]) -> dict[tuple[Any, str, str], set[str]]:
        wanted: dict[tuple[Any, str, str], set[str]] = {}
        for row in rows:
            inline = row.body.get("channel_values") or {}
            for channel, version in (row.body.get("channel_versions") or {}).items():
                key = (row.session_id, row.ns, channel, str(version))
                if channel not in inline and key not in self._done and key not in self._tried:
                    wanted.setdefault(key[:3], set()).add(key[3])
        return wanted

    def _resolve_all(
        self, wanted: dict[tuple[Any, str, str], set[str]], found: dict[Any, Any]
    ) -> None:
        for (session_id, ns, channel), versions in wanted.items():
            for version in versions:
                self._tried.add((session_id, ns, channel, version))
                self._resolve(session_id, ns, channel, version, found)

    def load(
        self, session_id: Any, ns: str, versions: dict[str, Any], inline: dict[str, Any]
    ) -> dict[str, Any]:
        """The values of one checkpoint's channels (read now unless prefetched)."""
        wanted = [
            (ch, str(v))
            for ch, v in versions.items()
            if ch not in inline and (session_id, ns, ch, str(v)) not in self._tried
        ]
        if wanted:
            row = _VersionsOf(session_id, ns, dict(wanted))
            self.prefetch([row])
        out = {}
        for channel, version in versions.items():
            if channel in inline:
                continue
            value = _whole(self._done.get((session_id, ns, channel, str(version)), _MISSING))
            if value is not _MISSING:
                out[channel] = value
        return out

    def _resolve(self, session_id: Any, ns: str, channel: str, version: str, rows: dict) -> Any:
        key = (session_id, ns, channel, version)
        if key in self._done:
            return _whole(self._done[key])
        chain: list[Any] = []  # GraphBlob rows, newest first
        cursor: str | None = version
        while cursor is not None and (session_id, ns, channel, cursor) not in self._done:
            row = rows.get((session_id, ns, channel, cursor))
            if row is None:
                if chain:
                    raise LookupError(
                        f"session {session_id}: the value of channel {channel!r} at version "
                        f"{chain[-1].version} builds on version {cursor}, which is gone"
                    )
                return _MISSING
            chain.append(row)
            cursor = row.base_version
        value: Any = (
            _whole(self._done[(session_id, ns, channel, cursor)]) if cursor is not None else None
        )
        serde = self._saver.serde
        # A chain's versions share one list that grows by each version's items: version k
        # is its first n_k items (_Prefix), copied out only when a checkpoint asks for it.
        grown: builtins.list[Any] | None = None
        for row in reversed(chain):
            key = (session_id, ns, channel, row.version)
            if row.type == "empty":
                value, grown = _MISSING, None
                self._done[key] = value
                continue
            loaded = serde.loads_typed(_open_blob(row.type, bytes(row.blob)))
            if row.base_version is None:
                value, grown = loaded, None
                self._done[key] = value
                continue
            if grown is None:
                grown = [*value]
            grown.extend(loaded)
            value = grown
            self._done[key] = _Prefix(grown, len(grown))
        return _whole(self._done[(session_id, ns, channel, version)])


class _ListChain(NamedTuple):
    """The last version of a list channel this saver stored, its items, and the versions
    (with their lengths) since the one stored whole."""

    version: str
    items: builtins.list[Any]
    chain: builtins.list[tuple[str, int]]


class _Prefix(NamedTuple):
    """The value of a list's version: the first `length` items of a shared list."""

    items: builtins.list[Any]
    length: int


def _whole(value: Any) -> Any:
    return value.items[: value.length] if isinstance(value, _Prefix) else value


_MISSING = object()
# The step at a graph row's seq (table alias {t}) was superseded by a rollback.
_SUPERSEDED = (
    "EXISTS (SELECT 1 FROM sessions_app_step s WHERE s.session_id = {t}.session_id"
    " AND s.seq = {t}.seq AND s.superseded_at IS NOT NULL)"
)


class _BlobRow(NamedTuple):
    channel: str
    version: str
    type: str
    blob: Any
    base_version: str | None


@dataclasses.dataclass
class _CheckpointRow:
    """A graph checkpoint as get_tuple's one statement reads it."""

    session_id: Any
    ns: str
    checkpoint_id: str
    parent_id: str | None
    seq: int
    body: dict[str, Any]
    metadata: dict[str, Any]
    superseded: bool


@dataclasses.dataclass
class _WriteRow:
    task_id: str
    channel: str
    seq: int
    superseded: bool
    type: str | None
    blob: Any
    task_path: str
    idx: int


@dataclasses.dataclass
class _VersionsOf:
    """The parts of a checkpoint row `_Values.prefetch` reads, for versions of one."""

    session_id: Any
    ns: str
    versions: dict[str, str]

    @property
    def body(self) -> dict[str, Any]:
        return {"channel_versions": self.versions}


_SCALARS = (str, int, float, bool)
# What PostgreSQL's text and jsonb refuse: NUL, and surrogates outside a pair.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# A NUL in JSON text: \u0000 after an even number of backslashes (not the text "\u0000").
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _superseded_step() -> Any:
    """The step at a graph row's seq, when a rollback superseded it (for Exists)."""
    from django.db.models import OuterRef

    from ..models import Step

    return Step.objects.filter(
        session_id=OuterRef("session_id"), seq=OuterRef("seq"), superseded_at__isnull=False
    )


def _with_superseded(qs: Any) -> Any:
    """Graph checkpoint rows, each with `superseded`: whether a rollback superseded its
    step (read in the same statement)."""
    from django.db.models import Exists

    return qs.annotate(superseded=Exists(_superseded_step()))


def _system_step(db: str, session_id: uuid.UUID, seq: int, payload: dict[str, Any]) -> datetime:
    """Record a write (a checkpoint, a task's writes) as the `system` step at `seq`, the
    seq its fenced write advanced the session to; returns the step's time."""
    now = _now()
    row = _store().NewRow(StepKind.SYSTEM, _redact(payload))
    _store().add_steps(session_id, [row], using=db, now=now, seq=seq)
    return now


def _store() -> Any:
    """The store's writes, imported late: a program imports this module before Django is
    set up (ensure_django)."""
    from ..store import writes

    return writes


def _graph_rows() -> Any:
    from ..store import graph

    return graph


def _redactor() -> Any:
    from ..runtime import redactor

    return redactor()


def _redact(payload: dict[str, Any]) -> dict[str, Any]:
    return _redactor().redact(payload)


# --- graphs run by Respawn's workers ------------------------------------------------------


def _default_input(text: str) -> dict[str, Any]:
    return {"messages": [("user", text)]}


class GraphRunner:
    """Runs a LangGraph graph as a Respawn agent's turn loop (see `graph_agent`).

    Each run continues the session's thread: with the answer to an `interrupt()` an
    operator gave, else with the user messages the graph has not seen yet, else from the
    latest checkpoint (after a crash, a rollback or a resume). Which inputs the graph has
    consumed is recorded in the metadata of the checkpoints it writes, so a run that dies
    before its input checkpoint commits gives the same input again."""

    def __init__(
        self,
        graph: Any,
        *,
        make_input: Callable[[str], Any] = _default_input,
        recursion_limit: int = 10_000,
    ) -> None:
        self.graph = graph
        self.make_input = make_input
        self.recursion_limit = recursion_limit

    def compiled(self, saver: RespawnSaver) -> Any:
        graph = (
            self.graph()
            if callable(self.graph) and not hasattr(self.graph, "invoke")
            else self.graph
        )
        if hasattr(graph, "compile") and not hasattr(graph, "invoke"):
            return graph.compile(checkpointer=saver)
        return graph.copy(update={"checkpointer": saver})

    def describe(self) -> RunnerDescription:
        """The graph's nodes (sessions_app.langgraph.gate)."""
        return gate.describe(self.graph)

    def session_problems(self, head: SessionHead) -> list[Problem]:
        """Nodes the session would run next that the graph no longer has (.gate)."""
        return gate.session_problems(self.graph, head, latest_checkpoint(head.session_id))

    def run(self, context: RunContext) -> RunnerResult:
        saver = RespawnSaver(lease=context.lease, agent=context.agent.name)
        try:
            return self._run(context, saver)
        finally:
            saver.close()

    def _run(self, context: RunContext, saver: RespawnSaver) -> RunnerResult:
        from langgraph.types import Command

        _graph_rows().ensure_thread(context.session_id, context.session_id)
        app = self.compiled(saver)
        thread = {"thread_id": context.session_id, "checkpoint_ns": ""}
        latest = saver.get_tuple({"configurable": thread})
        metadata = latest.metadata if latest is not None else {}
        input_seq = int(metadata.get("respawn_input_seq") or 0)
        resume_seq = int(metadata.get("respawn_resume_seq") or 0)
        history = [s for s in context.head.history if not s.superseded]
        resumes = [
            s for s in history if s.action == OperatorAction.ANSWER_INTERRUPT and s.seq > resume_seq
        ]
        inputs = [s for s in history if s.kind == StepKind.USER and s.seq > input_seq]
        if resumes:
            graph_input: Any = Command(resume=as_operator(resumes[-1].payload).get("value"))
            resume_seq = resumes[-1].seq
        elif inputs:
            graph_input = self.make_input("\n".join(step_text(s.payload) or "" for s in inputs))
            input_seq = inputs[-1].seq
        else:
            graph_input = None
            # A task's writes committed before a crash finish its step: run on from them.
            done = not app.get_state({"configurable": thread}).next
            if latest is not None and done and not latest.pending_writes:
                return RunnerResult.completed(_final_answer(latest.checkpoint))
        config = {
            "configurable": {
                **thread,
                "respawn_input_seq": input_seq,
                "respawn_resume_seq": resume_seq,
            },
            "recursion_limit": self.recursion_limit,
        }
        app.invoke(graph_input, config, durability="sync")
        state = app.get_state({"configurable": thread})
        interrupts = [{"id": i.id, "value": _summary(i.value)} for i in (state.interrupts or ())]
        if interrupts:
            return RunnerResult.waiting("interrupt", interrupts=interrupts)
        if state.next:
            return RunnerResult.waiting("stopped before " + ", ".join(state.next))
        return RunnerResult.completed(_final_answer({"channel_values": state.values}))


def _reply(values: dict[str, Any]) -> str | None:
    """The model's reply that ends a turn: the last message, when it is the model's (an
    AI message) and asks for no tool call."""
    messages = values.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    last = messages[-1]
    if getattr(last, "type", None) != "ai" or getattr(last, "tool_calls", None):
        return None
    content = getattr(last, "content", None)
    if isinstance(content, list):  # content blocks: their text
        content = "".join(
            part.get("text", "") if isinstance(part, dict) else str(part) for part in content
        )
    return content if isinstance(content, str) and content else None


def latest_checkpoint(session_id: str, *, database: str = "default") -> gate.Latest | None:
    """A thread's latest checkpoint as a run would load it, read on the caller's thread
    (the deploy gate reads every live session: no saver thread for each)."""
    from ..models import GraphWrite

    saver = RespawnSaver(database=database)
    try:
        row = saver._latest(uuid.UUID(str(session_id)), "")
        if row is None:
            return None
        loaded = saver._tuple(str(session_id), row)
    finally:
        saver.close()
    interrupted = GraphWrite.objects.using(database).filter(
        session_id=row.session_id, ns="", checkpoint_id=row.checkpoint_id, channel=gate.INTERRUPT
    )
    return gate.Latest(
        seq=row.seq,
        checkpoint=dict(loaded.checkpoint),
        interrupted=frozenset(
            _node_of(task_id, path)
            for task_id, path in interrupted.values_list("task_id", "task_path")
        ),
    )


def _final_answer(checkpoint: Any) -> str | None:
    messages = (checkpoint.get("channel_values") or {}).get("messages")
    if isinstance(messages, list) and messages:
        content = getattr(messages[-1], "content", None)
        if isinstance(content, str):
            return content
    return None


def graph_agent(
    name: str,
    graph: Any,
    *,
    version: str = "1",
    description: str = "",
    make_input: Callable[[str], Any] = _default_input,
    compatible_since: str | None = None,
) -> Agent:
    """A Respawn agent that runs `graph` (a StateGraph, a compiled graph, or a function
    returning one) on the workers. A session's user message becomes the graph's input
    through `make_input` (default: `{"messages": [("user", text)]}`)."""
    return Agent(
        name=name,
        version=version,
        description=description or "LangGraph graph",
        compatible_since=compatible_since,
        runner=GraphRunner(graph, make_input=make_input),
    )
