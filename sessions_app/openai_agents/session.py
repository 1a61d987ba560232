"""The OpenAI Agents SDK on Respawn: a `Session` that keeps an SDK conversation as a
Respawn session, paused runs that wait for a person's approval in the dashboard, and SDK
agents run by Respawn's workers.

    from agents import Runner
    from sessions_app.openai_agents.session import RespawnSession

    session = RespawnSession("ticket-42", agent="support")
    result = await Runner.run(support, "Where is my order?", session=session)
    if result.interruptions:               # a tool needs a person's approval
        await session.wait_for_approval(result)

Each conversation item is a step of the session (user messages as `user` steps, the
model's messages as `model` steps, tool calls and their outputs as `tool_call` and
`tool_result` steps; the SDK's item itself is kept whole in the step): the dashboard shows
the trace, search finds it, and redaction applies as to every step. `pop_item` and
`clear_session` supersede steps, they never delete them, and leave a system step saying so.

A run that stops on tool calls needing approval is stored with `wait_for_approval`: its
`RunState` goes into the session's checkpoint (with the SDK's own schema version), the
session waits for input, and the dashboard's or the API's approve / reject decides each
pending call. A worker then resumes the run: name the agent (`agent=`) after one registered
with `openai_agent`, which also runs SDK agents on the workers from the start, with crash
recovery, cancel, resume and fork as for any session.

Importing this module changes none of the SDK's global state: a program's own runs trace as
the program configured the SDK (`agents.set_tracing_disabled(True)`, or
`RunConfig(tracing_disabled=True)`, keeps their traces on the machine); the runs Respawn's
workers make are run with tracing disabled. The openai-agents package is needed
(`pip install 'respawn[openai-agents]'`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import dataclasses
import functools
import json
import uuid
from collections.abc import Callable
from typing import Any

try:
    from agents import Agent as SDKAgent
    from agents import (
        RunConfig,
        RunHooks,
        Runner,
        RunState,
        TResponseInputItem,
    )
    from agents.memory import SessionABC, SessionSettings
    from agents.memory.session_settings import coerce_session_settings, resolve_session_limit
    from agents.run_state import CURRENT_SCHEMA_VERSION as SDK_STATE_VERSION
    from agents.version import __version__ as SDK_VERSION
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "sessions_app.openai_agents.session needs the OpenAI Agents SDK: install it with "
        "`pip install openai-agents`, or Respawn's `openai-agents` extra "
        f"(`pip install 'respawn[openai-agents]'`). ({exc})"
    ) from exc

from agent_runtime.agents import Agent
from agent_runtime.loop import NEW_INPUT_ACTIONS
from agent_runtime.runners import Problem, RunContext, RunnerDescription, RunnerResult
from agent_runtime.state import (
    OperatorAction,
    PayloadField,
    PendingApproval,
    SessionState,
    StepKind,
    as_operator,
    as_tool_call,
    step_action,
    step_text,
    text_parts,
    validate_step_payload,
)
from agent_runtime.store import Lease, LeaseLost, SessionHead

from ..sdk_glue import SDK_SESSION_AGENT, OwnConnection, ensure_django, session_id_in
from ..sdk_glue import now as _now
from ..sealing import exact
from . import gate

__all__ = [
    "OpenAIAgentRunner",
    "RespawnSession",
    "RunStateVersionError",
    "SessionBusy",
    "openai_agent",
    "session_id_for",
]

# The field of a step's payload that holds the SDK item it records, whole.
ITEM = "item"

# Session ids that are not UUIDs map to Respawn session ids in this namespace (uuid5).
SESSION_NAMESPACE = uuid.UUID("0b7f3c1e-8a4d-4c52-b1f6-5e9a2d7c4f31")
DEFAULT_AGENT = SDK_SESSION_AGENT  # the program runs its sessions (see sdk_glue)
# The version of what this module keeps in a checkpoint's agent state.
STATE_VERSION = 1
STATE_KEY = "openai_agents"
SUMMARY_CHARS = 200


class SessionBusy(LeaseLost):
    """A worker runs this session (or is about to), or a tool call in it waits for a
    person's decision: a program outside it cannot write the conversation now. The refused
    write wrote nothing."""


class RunStateVersionError(ValueError):
    """A stored RunState was written by a newer SDK than the one installed."""


def session_id_for(session_id: str) -> uuid.UUID:
    """The Respawn session of an SDK session id: the id itself when it is a UUID in its
    canonical form (a session started from the dashboard or the API), else derived from
    it."""
    return session_id_in(SESSION_NAMESPACE, session_id, what="session_id")


def _version_key(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in str(version).split("."))
    except ValueError:
        raise RunStateVersionError(
            f"stored RunState has schema version {version!r}, which is not a version number"
        ) from None


def check_run_state_version(data: dict[str, Any]) -> str:
    """The schema version of a serialised RunState; RunStateVersionError when it is newer
    than what the installed SDK writes (the SDK refuses unknown older ones itself)."""
    version = data.get("$schemaVersion") if isinstance(data, dict) else None
    if not isinstance(version, str) or not version:
        raise RunStateVersionError("stored RunState has no schema version ($schemaVersion)")
    if _version_key(version) > _version_key(SDK_STATE_VERSION):
        raise RunStateVersionError(
            f"stored RunState has schema version {version}, newer than the {SDK_STATE_VERSION} "
            f"the installed openai-agents {SDK_VERSION} reads: run it on workers with a newer "
            "openai-agents"
        )
    return version


# --- items as steps -----------------------------------------------------------------------


def _plain(item: Any) -> dict[str, Any]:
    """An SDK item as plain JSON (the SDK hands dicts; a pydantic model is dumped). A value
    JSON cannot hold is refused (TypeError), as the SDK's own sessions refuse it, not
    stored as its str()."""
    if hasattr(item, "model_dump"):
        item = item.model_dump(mode="json", exclude_unset=True)
    if not isinstance(item, dict):
        raise TypeError(f"a session item must be a dict, got {type(item).__name__}")
    try:
        text = json.dumps(item, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"a session item must be JSON (what json.dumps takes), and this one is not: {exc}"
        ) from None
    return json.loads(text)


# PostgreSQL's jsonb cannot hold the NUL character (\u0000). An item with one is stored with
# every NUL, and every ESCAPE, written as ESCAPE + a letter, and its step says so
# (ITEM_ESCAPED): reading it reverses that, so the item comes back exactly as it was added.
ESCAPE = "\ue000"  # a private-use character: no text means anything by it
ITEM_ESCAPED = "item_nul_escaped"
_ESCAPES = {"\x00": ESCAPE + "0", ESCAPE: ESCAPE + "e"}
_UNESCAPES = {code: char for char, code in _ESCAPES.items()}


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def _map_strings(value: Any, fn: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {fn(k): _map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_strings(v, fn) for v in value]
    return value


def _escape(text: str) -> str:
    if "\x00" not in text and ESCAPE not in text:
        return text
    return "".join(_ESCAPES.get(char, char) for char in text)


def _unescape(text: str) -> str:
    if ESCAPE not in text:
        return text
    out, chars = [], iter(text)
    for char in chars:
        out.append(_UNESCAPES.get(char + next(chars, ""), char) if char == ESCAPE else char)
    return "".join(out)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text") or part.get("refusal") or "")
            for part in content
            if isinstance(part, dict)
        )
    return ""


def _arguments(raw: Any) -> dict[str, Any]:
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return {"raw": raw}
    return value if isinstance(value, dict) else {"value": value}


def _short(text: str) -> str:
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"


def step_for(item: dict[str, Any], names: dict[str, str]) -> tuple[str, dict[str, Any]]:
    """The step kind and payload of an item: a kind the trace shows as such, the item
    whole under "item". `names` maps call ids to tool names (a tool output names its
    tool only through its call)."""
    kind = item.get("type")
    role = item.get("role")
    if role == "user" and kind in (None, "message"):
        return StepKind.USER, {"content": text_parts(_text_of(item.get("content"))), ITEM: item}
    if role == "assistant" and kind in (None, "message"):
        return StepKind.MODEL, {
            "content": text_parts(_text_of(item.get("content"))),
            "tool_calls": [],
            "usage": {},
            "model": str((item.get("provider_data") or {}).get("model") or ""),
            ITEM: item,
        }
    if kind == "function_call":
        call_id = str(item.get("call_id") or "")
        names[call_id] = str(item.get("name") or "")
        return StepKind.TOOL_CALL, {
            "call_id": call_id,
            "name": str(item.get("name") or ""),
            "arguments": _arguments(item.get("arguments")),
            ITEM: item,
        }
    if kind == "function_call_output":
        call_id = str(item.get("call_id") or "")
        output = item.get("output")
        return StepKind.TOOL_RESULT, {
            "call_id": call_id,
            "name": names.get(call_id) or "tool",
            "status": "ok",
            "output": output if isinstance(output, str) else _text_of(output),
            ITEM: item,
        }
    return StepKind.SYSTEM, {"event": "sdk_item", "type": str(kind or role or "item"), ITEM: item}


def _step_of(item: dict[str, Any], names: dict[str, str]) -> tuple[str, dict[str, Any]]:
    """step_for, with an item that holds a NUL character escaped (ITEM_ESCAPED)."""
    if not _has_nul(item):
        return step_for(item, names)
    kind, payload = step_for(_map_strings(item, _escape), names)
    return kind, {**payload, ITEM_ESCAPED: True}


# A person's word on a call that needs approval.
APPROVAL_DECISIONS = (OperatorAction.APPROVE, OperatorAction.REJECT)


def _is_item(payload: dict[str, Any], kind: str) -> bool:
    return (
        ITEM in payload or kind == StepKind.USER or step_action(kind, payload) in NEW_INPUT_ACTIONS
    )


def item_of(
    kind: str, payload: dict[str, Any], correction: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The SDK item a step holds. A user step written by Respawn (a message sent from the
    dashboard or the API, the input a session started with) is a user message; an
    operator's instruction or correction is a user message marked as the operator's, as
    Respawn's own loop shows them; a corrected tool output carries the corrected value,
    labelled as the operator's (`correction`: the payload of the step that corrected it)."""
    action = step_action(kind, payload)
    if action == OperatorAction.INSTRUCTION:
        return {"role": "user", "content": f"[Operator instruction] {step_text(payload) or ''}"}
    if action == OperatorAction.CORRECT_RESULT:
        call_id = as_operator(payload).get("call_id")
        return {
            "role": "user",
            "content": (
                f"[Operator correction] The result of tool call {call_id} was "
                "corrected by an operator; continue from the corrected result."
            ),
        }
    if ITEM not in payload:
        return {"role": "user", "content": step_text(payload) or ""}
    item = payload[ITEM]
    if payload.get(ITEM_ESCAPED):
        item = _map_strings(item, _unescape)
    if correction is not None and item.get("type") == "function_call_output":
        corrected = {
            "output": correction.get("output"),
            "corrected_by_operator": correction.get("actor"),
        }
        if correction.get("note"):
            corrected["operator_note"] = correction["note"]
        item = {**item, "output": json.dumps(corrected, sort_keys=True, default=str)}
    return item


# --- the session --------------------------------------------------------------------------


class RespawnSession(SessionABC):
    """An OpenAI Agents SDK session kept as a Respawn session.

    session_id: the SDK's session id (any string; a UUID names that Respawn session).
    agent: the agent name of a session this creates: name an `openai_agent` to let the
    workers resume its paused runs and answer its new messages.
    database: the Django database alias to write through.
    lease: a worker's lease: this session then writes only under it (used by the workers).
    session_settings: the SDK's settings for the session (`SessionSettings(limit=N)` or
    `{"limit": N}`: how many of the latest items a run reads, and `get_items()` returns
    when given no limit of its own).

    The SDK's protocol methods are coroutines, whose database work runs on the session's
    own connection, off the event loop; `get_items_sync` and the other `*_sync` methods do
    the same from code that is not async, on the caller's thread (and its Django
    connection). Every write is one transaction under the session row's lock, so concurrent
    writers never interleave inside one call, and a pop returns each item once. After
    `close()` every call raises RuntimeError, as the SDK's own sessions do.
    """

    def __init__(
        self,
        session_id: str,
        *,
        agent: str = DEFAULT_AGENT,
        database: str = "default",
        lease: Lease | None = None,
        check: Callable[[], None] | None = None,
        agent_version: str = "",
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> None:
        ensure_django()
        self.session_id = session_id
        # As the SDK's own sessions: a dict is made SessionSettings, None the defaults.
        self.session_settings = (
            coerce_session_settings(session_settings)
            if session_settings is not None
            else SessionSettings()
        )
        self._closed = False
        self.respawn_id = session_id_for(session_id)
        self._agent = agent
        self._db = database
        self._lease = lease
        self._check = check
        # The version of the agent running the session (a worker's run): its checkpoints
        # say which version last ran it, so an older worker refuses it afterwards.
        self._agent_version = agent_version
        # The SDK calls a session from its event loop: the async methods do their
        # database work on this connection of the session's own, off the loop.
        self._own = OwnConnection("respawn-sdk-session", database)

    def __repr__(self) -> str:
        return f"RespawnSession({self.session_id!r}, respawn_id={str(self.respawn_id)!r})"

    # -- the SDK's protocol ---------------------------------------------------------------
    # The items are the SDK's own (plain dicts of its TypedDicts), as add_items stored them.
    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        return await self._on_connection(self.get_items_sync, limit)

    async def add_items(self, items: list[Any]) -> None:
        await self._on_connection(self.add_items_sync, items)

    async def pop_item(self) -> TResponseInputItem | None:
        return await self._on_connection(self.pop_item_sync)

    async def clear_session(self) -> None:
        await self._on_connection(self.clear_session_sync)

    async def wait_for_approval(self, result: Any) -> list[dict[str, Any]]:
        """Store a run that stopped on tool calls needing approval (a RunResult, or its
        RunState): the session waits until each call is approved or rejected in the
        dashboard or over the API, then a worker resumes the run. Returns the pending
        calls."""
        return await self._on_connection(self.wait_for_approval_sync, result)

    def trace_hooks(self) -> RunHooks:
        """Run hooks that write each tool call into the session's trace when it starts and
        when it ends (`sdk_tool_started`, `sdk_tool_finished` steps), so the dashboard shows
        a turn's tool calls while they run; its items come at the turn's end as always.
        Pass them to the run: `Runner.run(agent, text, session=s, hooks=s.trace_hooks())`
        (the workers' runs of `openai_agent` do)."""
        return _ToolTrace(self)

    async def _record_tool(self, payload: dict[str, Any]) -> None:
        await self._on_connection(self._write, lambda session: self._system_step(session, payload))

    async def record_usage(self, result: Any, *, since: Any = None) -> None:
        """Record what a run's model calls used (a RunResult's usage; less `since`, the
        usage a resumed RunState carried in) as a `sdk_usage` step and on the session's
        token counters, which the dashboard shows."""
        await self._on_connection(self.record_usage_sync, result, since)

    # -- the same, synchronous ------------------------------------------------------------
    def get_items_sync(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The live items, oldest first; with `limit` (else the session settings' limit),
        the latest `limit` of them."""
        self._check_open()
        limit = resolve_session_limit(limit, self.session_settings)
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            raise ValueError(f"limit must be None or an integer >= 0, got {limit!r}")
        if limit == 0:
            return []
        rows = self._item_rows(limit)
        # A correction comes after the output it corrects and is an item itself: the
        # corrections of the outputs read are among the rows read (the latest one wins).
        corrections = {
            as_operator(payload)["result_seq"]: payload
            for _, kind, _, payload in rows
            if kind == StepKind.OPERATOR
            and payload is not None
            and step_action(kind, payload) == OperatorAction.CORRECT_RESULT
        }
        # An item stored plainly comes as it is (a row without a payload) unless an
        # operator corrected it; any other row makes its item from the payload. Each row
        # was decoded for this call: the items are the caller's own.
        return [
            item
            if payload is None and seq not in corrections
            else item_of(kind, {ITEM: item} if payload is None else payload, corrections.get(seq))
            for seq, kind, item, payload in rows
        ]

    def add_items_sync(self, items: list[Any]) -> None:
        """Append items, in order, as steps; a consistent point (no tool call without its
        output) becomes a checkpoint, so a rollback or fork can start from it. The last
        item, when it is the model's message (or, in a program's session, a tool output
        with every call answered: a run whose final output is a tool's), is the session's
        final answer."""
        self._check_open()
        plain = [_plain(item) for item in items]
        if not plain:
            return
        calls = {i.get("call_id") for i in plain if i.get("type") == "function_call"}
        outputs = {i.get("call_id") for i in plain if i.get("type") == "function_call_output"}
        names = self._tool_names(outputs - calls) if outputs - calls else {}
        rows = [_store().NewRow(*_step_of(item, names)) for item in plain]
        for row in rows:
            validate_step_payload(row.kind, row.payload)
        consistent = not calls - outputs  # no call waits for its output: a checkpoint
        last = plain[-1]
        answer = None
        if last.get("role") == "assistant" and last.get("type") in (None, "message"):
            answer = _text_of(last.get("content"))
        elif self._lease is None and last.get("type") == "function_call_output" and consistent:
            # A program's run may end on a tool's output (tool_use_behavior
            # "stop_on_first_tool", StopAtTools): it is the conversation's latest answer
            # until a model message follows. A worker's run says its own at its end.
            output = last.get("output")
            answer = output if isinstance(output, str) else _text_of(output)
        final_answer = answer if consistent else None
        status = None
        if self._lease is None:  # a program's write: its answer says whether it is done
            status = "completed" if answer is not None else "waiting_input"
        if self._appended(rows, consistent=consistent, final_answer=final_answer, status=status):
            return

        def write(session: Any) -> None:
            _store().add_steps(session, rows, using=self._db)
            if consistent:
                self._checkpoint(session, final_answer=final_answer)
            if self._lease is None and session.status not in _RUNNABLE:
                session.status = status

        self._write(write)

    def _appended(
        self,
        rows: list[Any],
        *,
        consistent: bool,
        final_answer: str | None,
        status: str | None,
    ) -> bool:
        """add_items' usual case in one statement (store.writes.append_program): the
        session row advanced, the steps and the checkpoint written. False, having written
        nothing, when the row is not there or this writer may not write it as things stand
        (then `_write` locks the row and says why, or creates it)."""
        if self._db != "default":
            return False
        if self._check is not None:
            self._check()
        # Filled in from the session row by the statement: agent, version, step count.
        state = self._state("", "", 0, final_answer=final_answer) if consistent else None
        # One statement: atomic on its own (outside a transaction it commits by itself).
        last_seq = _store().append_program(
            self.respawn_id,
            rows,
            lease=self._lease,
            runnable=_RUNNABLE,
            checkpoint=state,
            agent_version=self._agent_version,
            final_answer=final_answer,
            status=status,
        )
        return last_seq is not None

    def pop_item_sync(self) -> dict[str, Any] | None:
        """Remove the latest item (its step is superseded, not deleted) and return it; None
        when the session has no item."""
        self._check_open()

        def write(session: Any) -> dict[str, Any] | None:
            step = self._item_steps().order_by("-seq").first()
            if step is None:
                return None
            _store().supersede(self._item_steps().filter(pk=step.pk))
            self._system_step(session, {"event": "sdk_item_popped", "seq": step.seq})
            last = self._item_steps().order_by("-seq").first()
            if last is None or last.kind != StepKind.TOOL_CALL:
                # What is left is a consistent point again (no call waits for its output).
                self._checkpoint(session, final_answer=None)
            return item_of(step.kind, exact(step.payload))

        return self._write(write)

    def clear_session_sync(self) -> None:
        """Remove every item (their steps are superseded, not deleted)."""
        self._check_open()

        def write(session: Any) -> None:
            count = _store().supersede(self._item_steps())
            self._system_step(session, {"event": "sdk_session_cleared", "items": count})
            self._checkpoint(session, final_answer=None)

        self._write(write)

    def wait_for_approval_sync(self, result: Any) -> list[dict[str, Any]]:
        self._check_open()
        state = result.to_state() if hasattr(result, "to_state") else result
        if not isinstance(state, RunState):
            raise TypeError(
                f"wait_for_approval takes a RunResult or a RunState, got {type(result).__name__}"
            )
        pending = [_approval(item) for item in state.get_interruptions()]
        if not pending:
            raise ValueError("the run did not stop on a tool call that needs approval")
        data = state.to_json()
        self._write(lambda session: self._pause(session, data, pending, decided={}))
        return pending

    def record_usage_sync(self, result: Any, since: Any = None) -> None:
        self._check_open()
        usage = result.context_wrapper.usage
        delta = {
            name: max(0, int(getattr(usage, name, 0) or 0) - int(getattr(since, name, 0) or 0))
            for name in ("requests", "input_tokens", "output_tokens")
        }
        if not any(delta.values()):
            return
        self._write(
            lambda session: self._system_step(
                session,
                {"event": "sdk_usage", **delta},
                tokens_in=delta["input_tokens"],
                tokens_out=delta["output_tokens"],
            )
        )

    # -- writing ---------------------------------------------------------------------------
    def _write(self, write: Callable[[Any], Any]) -> Any:
        """One transaction under the session row's lock: check this writer may write,
        then `write(session)`, then save the session row."""
        from django.db import transaction

        self._check_open()
        if self._check is not None:
            self._check()
        with transaction.atomic(using=self._db):
            session = self._locked()
            self._may_write(session)
            value = write(session)
            session.updated_at = _now()
            session.save(using=self._db, update_fields=_SESSION_FIELDS)
        return value

    def _locked(self) -> Any:
        from django.db import IntegrityError, transaction

        from ..models import AgentSession

        session = (
            AgentSession.objects.using(self._db)
            .select_for_update()
            .filter(id=self.respawn_id)
            .first()
        )
        if session is not None:
            return session
        if self._lease is not None:
            raise LeaseLost(f"session {self.respawn_id} is gone (deleted); nothing was written")
        now = _now()
        try:
            with transaction.atomic(using=self._db):
                AgentSession.objects.using(self._db).create(
                    id=self.respawn_id,
                    agent=self._agent,
                    agent_version=_agent_version(self._agent),
                    title=_short(f"OpenAI Agents SDK session {self.session_id}"),
                    status="waiting_input",
                    created_at=now,
                    updated_at=now,
                )
        except IntegrityError:
            pass  # another writer created it first
        return AgentSession.objects.using(self._db).select_for_update().get(id=self.respawn_id)

    def _may_write(self, session: Any) -> None:
        if self._lease is not None:
            if not _store().holds(session, self._lease):
                raise LeaseLost(
                    f"session {self.respawn_id}: this run's lease (token {self._lease.token}) "
                    f"was superseded by {session.lease_owner or 'an operator action'} (token "
                    f"{session.fencing_token}); nothing was written"
                )
            return
        if session.status in _RUNNABLE:
            holder = (
                f"worker {session.lease_owner}" if session.lease_is_live() else "a worker's run"
            )
            raise SessionBusy(
                f"session {self.respawn_id} is {session.status}: {holder} owns its "
                "conversation until the run ends; nothing was written"
            )
        pending = self._pending_call(session) if session.status == "waiting_input" else None
        if pending:
            raise SessionBusy(
                f"session {self.respawn_id} waits for a person's decision on tool call "
                f"{pending}: approve or reject it (the dashboard, the API), "
                "and a worker resumes the run; nothing was written"
            )
        if session.lease_owner:
            # An expired lease of a run that ended badly: fence it off for good.
            _store().fence(session)

    def _pending_call(self, session: Any) -> str | None:
        """The call id of the approval the head checkpoint waits for, if any."""
        from ..models import Checkpoint

        pending = (
            Checkpoint.objects.using(self._db)
            .filter(session_id=session.id, seq=session.head)
            .order_by("-id")
            .values_list("state__pending_approval", flat=True)
            .first()
        )
        return pending.get("call_id") if isinstance(pending, dict) else None

    def _item_rows(self, limit: int | None) -> list[tuple[int, str, Any, dict[str, Any] | None]]:
        """(seq, kind, item, payload) of the live item steps, oldest first; the latest
        `limit`. A step holding its item plainly comes as its item and no payload, any
        other as its payload (opened when sealed) and no item."""
        from django.db import connections

        if self._db == "default" and connections[self._db].vendor == "postgresql":
            from ..store.postgresql import item_rows

            rows = item_rows(
                self.respawn_id,
                item_key=ITEM,
                escaped_key=ITEM_ESCAPED,
                actions=sorted(NEW_INPUT_ACTIONS),
                limit=limit,
            )
            # An item with a secret in it is stored sealed: the run gets it back exactly.
            return [
                (seq, kind, item, None if payload is None else exact(payload))
                for seq, kind, item, payload in rows
            ]
        steps = self._item_steps().values_list("seq", "kind", "payload")
        if limit is None:
            found = list(steps.order_by("seq"))
        else:
            found = list(steps.order_by("-seq")[:limit])
            found.reverse()
        return [(seq, kind, None, exact(payload)) for seq, kind, payload in found]

    def _item_steps(self) -> Any:
        from django.db.models import Q

        from ..models import Step, payload_q

        return Step.objects.using(self._db).filter(
            payload_q("has_key", value=ITEM)
            | Q(kind=StepKind.USER)
            | payload_q(PayloadField.ACTION, "in", value=NEW_INPUT_ACTIONS, kind=StepKind.OPERATOR),
            session_id=self.respawn_id,
            superseded_at__isnull=True,
        )

    def _tool_names(self, call_ids: set[str | None]) -> dict[str, str]:
        from ..models import Step, payload_q

        rows = Step.objects.using(self._db).filter(
            payload_q(PayloadField.CALL_ID, "in", value=sorted(c for c in call_ids if c)),
            session_id=self.respawn_id,
            kind=StepKind.TOOL_CALL,
        )
        calls = [as_tool_call(exact(r.payload)) for r in rows]
        return {call.get("call_id"): call.get("name") for call in calls}

    def _system_step(
        self, session: Any, payload: dict[str, Any], *, tokens_in: int = 0, tokens_out: int = 0
    ) -> int:
        return _store().add_step(
            session,
            StepKind.SYSTEM,
            payload,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            using=self._db,
        )

    def _checkpoint(
        self,
        session: Any,
        *,
        final_answer: str | None,
        data: dict[str, Any] | None = None,
        pending: PendingApproval | None = None,
    ) -> None:
        state = self._state(
            session.agent,
            session.agent_version,
            session.last_seq,
            final_answer=final_answer,
            data=data,
            pending=pending,
        )
        _store().add_checkpoint(session, state, using=self._db)
        session.head = session.last_seq
        if final_answer is not None:
            session.final_answer = final_answer

    def _state(
        self,
        agent: str,
        agent_version: str,
        last_seq: int,
        *,
        final_answer: str | None,
        data: dict[str, Any] | None = None,
        pending: PendingApproval | None = None,
    ) -> dict[str, Any]:
        """The state of a checkpoint at `last_seq` of a session of `agent`."""
        state = SessionState(
            agent_name=agent,
            agent_version=self._agent_version or agent_version or "",
            pending_approval=pending,
            final_answer=final_answer,
            agent_state={
                "version": STATE_VERSION,
                "data": {STATE_KEY: data or {"sdk_version": SDK_VERSION}},
            },
        )
        state.counters.steps = last_seq
        return state.to_dict()

    def _pause(
        self,
        session: Any,
        run_state: dict[str, Any],
        pending: list[dict[str, Any]],
        *,
        decided: dict[str, dict[str, Any]],
    ) -> None:
        """A system step naming the calls that wait, and a checkpoint holding the RunState
        with the first undecided call as the session's pending approval."""
        waiting = [p for p in pending if p["call_id"] not in decided]
        self._system_step(
            session,
            {
                "event": "approval_requested",
                "calls": [
                    {"call_id": p["call_id"], "tool": p["tool"], "arguments": p["arguments"]}
                    for p in waiting
                ],
            },
        )
        first = waiting[0]
        approval = PendingApproval(
            call_id=first["call_id"],
            tool=first["tool"],
            arguments=first["arguments"],
            model_seq=session.last_seq,
            requested_at=_now().isoformat(),
        )
        data = {
            "sdk_version": SDK_VERSION,
            "run_state_version": run_state.get("$schemaVersion"),
            "run_state": run_state,
            "pending": pending,
            "decided": decided,
        }
        self._checkpoint(session, final_answer=None, data=data, pending=approval)
        session.final_answer = ""  # the last turn's answer is not this run's
        if self._lease is None:
            session.status = "waiting_input"
            _store().release(session)

    # -- the session's connection ------------------------------------------------------
    def close(self) -> None:
        """Close the session's database connection. The session is closed for good: a
        later call raises RuntimeError (closing again does nothing)."""
        self._closed = True
        self._own.close()

    async def _on_connection(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on the session's connection, off the event loop (RuntimeError once
        the session is closed)."""
        self._check_open()
        return await self._own.run(fn, *args)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"RespawnSession {self.session_id!r} is closed")


_RUNNABLE = ("queued", "running")
# What a session's writes change on its row.
_SESSION_FIELDS = [
    "last_seq",
    "step_count",
    "head",
    "final_answer",
    "status",
    "fencing_token",
    "lease_owner",
    "lease_expires_at",
    "tokens_in",
    "tokens_out",
    "updated_at",
]


class _ToolTrace(RunHooks):
    """RespawnSession.trace_hooks: a tool call in the trace while it runs."""

    def __init__(self, session: RespawnSession) -> None:
        self._session = session

    @staticmethod
    def _call(context: Any, tool: Any) -> dict[str, Any]:
        return {
            "tool": str(getattr(tool, "name", type(tool).__name__)),
            "call_id": getattr(context, "tool_call_id", None),
        }

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        call = self._call(context, tool)
        arguments = _arguments(getattr(context, "tool_arguments", None))
        await self._session._record_tool({"event": TOOL_STARTED, **call, "arguments": arguments})

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
        call = self._call(context, tool)
        output = _short(result if isinstance(result, str) else json.dumps(result, default=str))
        await self._session._record_tool({"event": TOOL_FINISHED, **call, "output": output})


# The system events of a tool call while it runs (RespawnSession.trace_hooks).
TOOL_STARTED = "sdk_tool_started"
TOOL_FINISHED = "sdk_tool_finished"


def _store() -> Any:
    """The store's writes, imported late: a program imports this module before Django is
    set up (ensure_django)."""
    from ..store import writes

    return writes


def _approval(item: Any) -> dict[str, Any]:
    raw = item.raw_item
    get = raw.get if isinstance(raw, dict) else functools.partial(getattr, raw)
    call_id = get("call_id", None) or get("id", None) or ""
    return {
        "call_id": str(call_id),
        "tool": str(getattr(item, "tool_name", None) or get("name", None) or "tool"),
        "arguments": _arguments(get("arguments", None) or {}),
    }


def _agent_version(name: str) -> str:
    from ..runtime import agent_registry

    try:
        registry = agent_registry()
    except Exception:  # the program has agents of its own, or none: nothing to record
        return ""
    return registry.get(name).version if name in registry else ""


# --- SDK agents run by Respawn's workers --------------------------------------------------


class OpenAIAgentRunner:
    """Runs an SDK `Agent` as a Respawn agent's turn loop (see `openai_agent`).

    Each run continues the session's conversation: a paused run whose pending calls were
    all decided is resumed from its stored RunState; otherwise the SDK runs on the live
    items (a new user message, or the turn a crash cut short: the SDK stores a turn's
    tool calls with their outputs, so a run killed mid-turn starts that turn again)."""

    def __init__(
        self,
        agent: SDKAgent,
        *,
        run_config: RunConfig | None = None,
        max_turns: int = 10,
    ) -> None:
        self.agent = agent
        # A copy: the caller's RunConfig may serve its own runs, with tracing of its choice.
        self.run_config = dataclasses.replace(run_config or RunConfig(), tracing_disabled=True)
        self.max_turns = max_turns

    def run(self, context: RunContext) -> RunnerResult:
        session = RespawnSession(
            context.session_id,
            agent=context.agent.name,
            lease=context.lease,
            check=context.check,
            agent_version=context.agent.version,
        )
        try:
            return _run_coroutine(self._run(context, session))
        finally:
            session.close()

    def describe(self) -> RunnerDescription:
        """The SDK agent's model, instructions and tools (sessions_app.openai_agents.gate)."""
        return gate.describe(self.agent, self.run_config)

    def session_problems(self, head: SessionHead) -> list[Problem]:
        """Calls the session still has to run to tools this agent no longer has (.gate)."""
        return gate.session_problems(self.agent, head, state_key=STATE_KEY)

    async def _run(self, context: RunContext, session: RespawnSession) -> RunnerResult:
        checkpoint = context.head.checkpoint
        data = checkpoint.state.agent_data.get(STATE_KEY) if checkpoint else None
        history = [s for s in context.head.history if not s.superseded]
        if checkpoint and data and data.get("run_state") is not None:
            after = [s for s in history if s.seq > checkpoint.seq]
            # Items written after the pause: a resumed run got that far and died. Its
            # RunState is spent; the conversation goes on from the items.
            if not any(_is_item(s.payload, s.kind) for s in after):
                return await self._resume(context, session, data, after)
        items = await session.get_items()
        if items and items[-1].get("role") == "assistant":
            # The answer was stored before the run could record its end.
            return RunnerResult.completed(_text_of(items[-1].get("content")))
        result = await Runner.run(
            self.agent,
            [],
            session=session,
            run_config=self.run_config,
            max_turns=self.max_turns,
            hooks=session.trace_hooks(),
        )
        await session.record_usage(result)
        return await self._outcome(session, result)

    async def _resume(
        self,
        context: RunContext,
        session: RespawnSession,
        data: dict[str, Any],
        after: list[Any],
    ) -> RunnerResult:
        decided = dict(data.get("decided") or {})
        pending = list(data.get("pending") or [])
        calls = {p["call_id"] for p in pending}
        for step in after:
            word = as_operator(step.payload)
            if step.action in APPROVAL_DECISIONS and word.get("call_id") in calls:
                decided[word["call_id"]] = {
                    "action": word["action"],
                    "actor": word.get("actor"),
                    "reason": word.get("reason"),
                }
        run_state = data["run_state"]
        if any(p["call_id"] not in decided for p in pending):
            await session._on_connection(
                session._write, lambda s: session._pause(s, run_state, pending, decided=decided)
            )
            return RunnerResult.waiting(
                "approval", calls=[p for p in pending if p["call_id"] not in decided]
            )
        check_run_state_version(run_state)
        state = await RunState.from_json(self.agent, run_state)
        carried = copy.copy(state._context.usage) if state._context is not None else None
        for item in state.get_interruptions():
            decision = decided.get(_approval(item)["call_id"])
            if decision is None:
                continue
            if decision["action"] == OperatorAction.APPROVE:
                state.approve(item)
            else:
                reason = decision.get("reason")
                state.reject(
                    item,
                    rejection_message=(
                        f"A person rejected this tool call: {reason}" if reason else None
                    ),
                )
        result = await Runner.run(
            self.agent,
            state,
            session=session,
            run_config=self.run_config,
            max_turns=self.max_turns,
            hooks=session.trace_hooks(),
        )
        await session.record_usage(result, since=carried)
        return await self._outcome(session, result)

    async def _outcome(self, session: RespawnSession, result: Any) -> RunnerResult:
        if result.interruptions:
            pending = await session.wait_for_approval(result)
            return RunnerResult.waiting("approval", calls=pending)
        output = result.final_output
        text = output if isinstance(output, str) else json.dumps(output, default=str)
        return RunnerResult.completed(text)


def _describe(agent: SDKAgent) -> str:
    names = [getattr(t, "name", type(t).__name__) for t in agent.tools]
    return f"OpenAI Agents SDK agent {agent.name!r}" + (
        f" (tools: {', '.join(names)})" if names else ""
    )


def _run_coroutine(coroutine: Any) -> Any:
    """asyncio.run, on a thread of its own when this thread already runs an event loop (a
    run started from async code: asyncio.run cannot nest)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="respawn-sdk-run") as pool:
        return pool.submit(asyncio.run, coroutine).result()


def openai_agent(
    name: str,
    agent: SDKAgent,
    *,
    version: str = "1",
    description: str = "",
    compatible_since: str | None = None,
    run_config: RunConfig | None = None,
    max_turns: int = 10,
) -> Agent:
    """A Respawn agent that runs the SDK `agent` on the workers. A session's user messages
    are the conversation's input; its items are the session's steps (a `RespawnSession`
    bound to the worker's lease), and a run stopping for approval waits in the dashboard."""
    if not isinstance(agent, SDKAgent):
        raise TypeError(f"openai_agent takes an agents.Agent, got {type(agent).__name__}")
    return Agent(
        name=name,
        version=version,
        description=description or _describe(agent),
        compatible_since=compatible_since,
        runner=OpenAIAgentRunner(agent, run_config=run_config, max_turns=max_turns),
    )
