"""The agent loop: claim, load, think, act, checkpoint, repeat.

- `trace`: what a trace means — what the session does next (`next_action`) and the state
  it adds up to (`apply_step`, `replay`); the one reader of the trace.
- `conversation`: the messages a model sees, rendered from the steps.
- `heartbeat`: keeping the lease alive while a model call or tool runs, and the fence.
- `run`: a run of a session (`run_session`), its configuration and its outcome.
- `branches`: fan-out branches, each tool call of a turn as its own job, and the join.
"""

from .branches import BranchOutcome, BranchResult, run_branch
from .conversation import Conversation, build_messages
from .heartbeat import Heartbeat, fence_guard
from .run import (
    BUDGET_REACHED,
    Outcome,
    ProviderFactory,
    RunConfig,
    RunResult,
    progress_sink,
    report_late_call,
    result_payload,
    run_session,
    usage_record,
)
from .trace import (
    DECISIONS,
    NEW_INPUT_ACTIONS,
    UNCERTAIN_RESOLUTIONS,
    Action,
    CallModel,
    Finished,
    PendingCall,
    RunTools,
    apply_step,
    current_fan_out,
    new_state,
    next_action,
    replay,
    uncertain_resolution,
)

__all__ = [
    "BUDGET_REACHED",
    "DECISIONS",
    "NEW_INPUT_ACTIONS",
    "UNCERTAIN_RESOLUTIONS",
    "Action",
    "BranchOutcome",
    "BranchResult",
    "CallModel",
    "Conversation",
    "Finished",
    "Heartbeat",
    "Outcome",
    "PendingCall",
    "ProviderFactory",
    "RunConfig",
    "RunResult",
    "RunTools",
    "apply_step",
    "build_messages",
    "current_fan_out",
    "fence_guard",
    "new_state",
    "next_action",
    "progress_sink",
    "replay",
    "report_late_call",
    "result_payload",
    "run_branch",
    "run_session",
    "uncertain_resolution",
    "usage_record",
]
