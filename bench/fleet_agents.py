"""The fleet soak's own agent (bench/fleet.py loads it with RESPAWN_AGENTS, as a team loads
its agents): `stuck` counts like the demo `slow` agent, but its tick says where it is once
inside `ctx.fenced()` (a file named by its process id in RESPAWN_FLEET_STUCK_DIR) and
stays there a moment, so the soak can stop the process holding the fence's row lock."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import demo_agents  # noqa: F401 - registers the scripted:slow model
from agent_runtime import Agent, Limits, ToolContext, tool


@tool(name="tick")
def stuck_tick(ctx: ToolContext, n: int) -> dict[str, Any]:
    """Count one tick: inside the fence, the first tick says so and waits a moment."""
    with ctx.fenced():
        if n == 1:
            mark = Path(os.environ["RESPAWN_FLEET_STUCK_DIR"]) / str(os.getpid())
            mark.write_text(ctx.session_id)
            time.sleep(1.0)  # the soak stops this process here (SIGSTOP)
        ctx.effects.record(
            ctx.idempotency_key, session_id=ctx.session_id, tool="tick", payload={"n": n}
        )
    return {"n": n}


def agents() -> list[Agent]:
    return [
        Agent(
            name="stuck",
            version="1",
            description="'count to N' whose first tick stops inside ctx.fenced().",
            model="scripted:slow",
            instructions="Count, one tick per turn.",
            tools=[stuck_tick],
            limits=Limits(max_steps=100),
        )
    ]
