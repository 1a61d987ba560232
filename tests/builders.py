"""A long session built straight into the database, with what an operator has to find in
one: retried tool calls, a failed tool call, a worker that died mid-call, an operator's
instruction after a long wait, a model failure resumed by a person, and a fan-out.

Steps are written with bulk_create (5,000 steps in well under a second) in the shapes the
engine writes; tests/sessions_app/test_trace.py checks the trace reads them as it reads
sessions run by real workers."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from django.utils import timezone

from agent_runtime.state import SCHEMA_VERSION
from sessions_app.models import AgentSession, AuditEvent, Checkpoint, Status, Step


@dataclass
class LongSession:
    session: AgentSession
    failed_tool_seq: int = 0  # the tool result that failed
    model_error_seq: int = 0  # the model failure a person resumed after
    crash_call_seq: int = 0  # the tool call a worker died in
    crash_run_seq: int = 0  # the run_started after that crash
    retried_seqs: list[int] = field(default_factory=list)
    instruction_seq: int = 0
    fan_out_seq: int = 0
    run_seqs: list[int] = field(default_factory=list)


def _text(text: str) -> list[dict[str, str]]:
    return [{"type": "text", "text": text}]


def build_long_session(
    steps: int = 5000, *, title: str = "a long count", status: str = Status.COMPLETED
) -> LongSession:
    now = timezone.now()
    t = now - timedelta(hours=5)
    session = AgentSession.objects.create(
        agent="slow", title=title, status=Status.QUEUED, created_at=t, updated_at=t
    )
    out = LongSession(session)
    rows: list[Step] = []
    checkpoints: list[int] = []
    clock = [t]

    def add(kind: str, payload: dict, *, took_ms: float = 0.0, gap_ms: float = 2.0, **extra):
        clock[0] += timedelta(milliseconds=gap_ms)
        start = clock[0]
        clock[0] += timedelta(milliseconds=took_ms)
        seq = len(rows) + 1
        rows.append(
            Step(
                session=session,
                seq=seq,
                kind=kind,
                payload=payload,
                schema_version=SCHEMA_VERSION,
                started_at=start,
                finished_at=clock[0] if took_ms or kind != "system" else None,
                created_at=clock[0],
                **extra,
            )
        )
        return seq

    def run_started(worker: str) -> int:
        seq = add(
            "system",
            {"event": "run_started", "worker": worker, "checkpoint_seq": None, "upgraders": []},
        )
        out.run_seqs.append(seq)
        return seq

    def wait(seconds: float) -> None:
        clock[0] += timedelta(seconds=seconds)

    add("user", {"content": _text(f"count to {steps}")})
    run_started("w1-host-a")
    turn = 0
    crashed = instructed = failed_model = fanned = failed_tool = False
    while len(rows) < steps - 4:
        turn += 1
        call_id = f"call_{turn}"
        add(
            "model",
            {
                "content": _text(f"Tick {turn}."),
                "tool_calls": [{"id": call_id, "name": "tick", "arguments": {"n": turn}}],
                "usage": {"input_tokens": 40 + turn % 7, "output_tokens": 10, "cost": 0.0004},
                "model": "scripted:slow",
            },
            took_ms=180 + (turn * 37) % 400,
            tokens_in=40 + turn % 7,
            tokens_out=10,
        )
        seq = len(rows) + 1
        add(
            "tool_call",
            {"call_id": call_id, "name": "tick", "arguments": {"n": turn}},
            idempotency_key=f"{session.id}:{seq}",
        )
        position = len(rows) / steps
        if not crashed and position > 0.3:
            # The worker dies in the tool; another takes over after the lease expires.
            crashed = True
            out.crash_call_seq = len(rows)
            wait(41)
            out.crash_run_seq = run_started("w2-host-b")
        result = {
            "call_id": call_id,
            "name": "tick",
            "status": "ok",
            "output": {"n": turn},
            "error": None,
            "attempts": 1,
        }
        if turn % 97 == 0:
            result["attempts"] = 3
            result["attempt_errors"] = ["503 Service Unavailable", "connection reset by peer"]
        if not failed_tool and position > 0.7:
            failed_tool = True
            result.update(status="error", output=None, error="tick refused: n is out of range")
        seq = add("tool_result", result, took_ms=90 + (turn * 13) % 300)
        if result["attempts"] > 1:
            out.retried_seqs.append(seq)
        if result["status"] == "error":
            out.failed_tool_seq = seq
        checkpoints.append(seq)
        if not instructed and position > 0.45:
            instructed = True
            wait(2 * 3600)  # nobody looked for two hours
            out.instruction_seq = add(
                "operator",
                {"action": "instruction", "actor": "olivia", "content": _text("count faster")},
            )
            run_started("w1-host-a")
        if not failed_model and position > 0.55:
            failed_model = True
            out.model_error_seq = add(
                "error",
                {
                    "where": "model",
                    "error": "model call failed after 4 attempt(s): 529 overloaded",
                    "attempts": 4,
                },
            )
            wait(600)
            resumed_at = clock[0]
            AuditEvent.objects.create(
                actor_label="olivia",
                action="resume",
                session=session,
                created_at=resumed_at,
            )
            wait(1)
            run_started("w3-host-c")
        if not fanned and position > 0.8:
            fanned = True
            turn += 1
            calls = [
                {"id": f"call_{turn}_{i}", "name": "tick", "arguments": {"n": i}} for i in range(3)
            ]
            add(
                "model",
                {
                    "content": _text("Three at once."),
                    "tool_calls": calls,
                    "usage": {"input_tokens": 50, "output_tokens": 30},
                    "model": "scripted:slow",
                },
                took_ms=200,
                tokens_in=50,
                tokens_out=30,
            )
            first = len(rows) + 1
            for i, call in enumerate(calls):
                add(
                    "tool_call",
                    {
                        "call_id": call["id"],
                        "name": "tick",
                        "arguments": call["arguments"],
                        "branch": {"index": i + 1, "of": 3},
                    },
                    idempotency_key=f"{session.id}:{first + i}",
                    gap_ms=0.1,
                )
            out.fan_out_seq = add(
                "system",
                {"event": "fan_out", "calls": list(range(first, first + 3)), "limit": 8},
            )
            branch_start = clock[0]
            for i, call in enumerate(calls):
                clock[0] = branch_start  # the branches overlap in time
                add(
                    "tool_result",
                    {
                        "call_id": call["id"],
                        "name": "tick",
                        "status": "ok",
                        "output": {"n": i},
                        "error": None,
                        "attempts": 1,
                        "branch": {"index": i + 1, "of": 3},
                    },
                    took_ms=300 + 50 * i,
                    gap_ms=1,
                )
            add("system", {"event": "joined", "results": 3})
            run_started("w2-host-b")
    add(
        "model",
        {
            "content": _text(f"Counted to {turn}."),
            "tool_calls": [],
            "usage": {"input_tokens": 60, "output_tokens": 8},
            "model": "scripted:slow",
        },
        took_ms=150,
        tokens_in=60,
        tokens_out=8,
    )
    checkpoints.append(len(rows))
    Step.objects.bulk_create(rows, batch_size=2000)
    # The state as the current schema stores it (tests/sessions_app/test_trace.py loads it).
    state = {
        "schema_version": SCHEMA_VERSION,
        "agent": {"name": "slow", "version": "1"},
        "turn": turn,
        "plan": [{"id": "p1", "title": "count", "status": "done"}],
        "memory_refs": [],
        "counters": {
            "steps": len(rows),
            "model": {"calls": turn, "tokens_in": 0, "tokens_out": 0, "cost": 0.0},
            "tools": {"calls": turn, "retries": 0},
        },
        "budgets": {"max_steps": 100000, "max_tokens": None, "max_cost": None},
        "pending_approval": None,
        "uncertain_calls": [],
        "batch_cursor": None,
        "final_answer": f"Counted to {turn}.",
        "agent_state": None,
    }
    Checkpoint.objects.bulk_create(
        [
            Checkpoint(
                session=session,
                seq=seq,
                state=state,
                schema_version=SCHEMA_VERSION,
                created_at=rows[seq - 1].created_at,
            )
            for seq in checkpoints
        ],
        batch_size=2000,
    )
    tokens_in = sum(s.tokens_in for s in rows)
    tokens_out = sum(s.tokens_out for s in rows)
    AgentSession.objects.filter(id=session.id).update(
        status=status,
        head=len(rows),
        last_seq=len(rows),
        step_count=len(rows),
        tokens_in=tokens_in,
        tokens_out=tokens_out,
        cost=round(0.0004 * turn, 6),
        final_answer=f"Counted to {turn}." if status == Status.COMPLETED else "",
        updated_at=clock[0],
    )
    session.refresh_from_db()
    return out
