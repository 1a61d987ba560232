"""Real `manage.py rqworker` processes for the worker benches (throughput, recovery).

The workers run Respawn's own job (`sessions_app.workers.jobs.run_session_job`), store, lease,
heartbeat and reconciler, with the project's settings. The one addition is the bench
agent: `BenchWorker` (given with --worker-class) adds it to the agents the job looks up, so
that the workload is the benches' (a zero-latency scripted model, a tool that returns its
argument) instead of a demo agent's (whose tools sleep or write side-effect rows).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from rq import Worker

from sessions_app.workers.worker import RespawnWorker
from tests.servers import WorkerProcess

AGENT = "bench"


def bench_agent():
    from typing import Any

    from agent_runtime.agents import Agent, Limits
    from agent_runtime.tools import ToolContext, tool

    @tool(name="tick")
    def tick(ctx: ToolContext, n: int) -> dict[str, Any]:
        """Return n."""
        return {"n": n}

    # The scripted "slow" model: "count to N" is N turns, one tick call each.
    return Agent(
        name=AGENT,
        version="1",
        description="bench workload: N turns of one trivial tool call",
        model="scripted:slow",
        instructions="Count, one tick per turn.",
        tools=[tick],
        limits=Limits(max_steps=100_000),
    )


def install_bench_agent() -> None:
    """The demo agents plus the bench agent, where the job and session_start look them up."""
    from agent_runtime.agents import AgentRegistry
    from sessions_app import runtime
    from sessions_app.services import core as services
    from sessions_app.workers import jobs

    demo = runtime.agent_registry()
    registry = AgentRegistry([*(demo.get(name) for name in demo.names()), bench_agent()])
    jobs.agent_registry = lambda: registry
    services.agent_registry = lambda: registry


class BenchWorker(RespawnWorker):
    def work(self, *args, **kwargs):  # type: ignore[override]
        install_bench_agent()
        return super().work(*args, **kwargs)


class BenchForkingWorker(Worker, BenchWorker):
    """For comparison only: RQ's default execution, a work horse forked for every job (and
    so a new PostgreSQL connection for every job), under the same supervisor. (RQ's
    forking Worker first: its execute_job and horse handling override SimpleWorker's.)"""


class Worker(WorkerProcess):
    """One rqworker running the bench's worker class (its agent installed), its log in
    `log_dir`."""

    stop_timeout = 15.0

    def __init__(
        self,
        env: dict[str, str],
        queue: str,
        name: str,
        log_dir: Path,
        worker_class: str = "bench._workers.BenchWorker",
    ) -> None:
        super().__init__(env, log_dir / f"{name}.log", name, queue, worker_class)


def worker_env(database_url: str, redis_url: str, queue: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings",
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        RESPAWN_QUEUE=queue,
        RESPAWN_PRODUCTION="0",
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def wait_ready(workers: list[Worker], redis_url: str, timeout: float = 60) -> None:
    """Until every worker has registered with Redis (it is then blocked on its queue)."""
    import redis
    from rq import Worker as RQWorker

    connection = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + timeout
    names = {w.name for w in workers}
    while time.monotonic() < deadline:
        registered = {w.name for w in RQWorker.all(connection=connection)}
        if names <= registered:
            return
        for w in workers:
            if w.process.poll() is not None:
                raise RuntimeError(f"worker {w.name} exited: {w.log_path.read_text()[-2000:]}")
        time.sleep(0.1)
    raise TimeoutError("workers did not start")


def start_session(turns: int) -> str:
    """A session of the bench agent, dispatched the way the dashboard and the API do it
    (services.session_start: the row, the user step, enqueue after commit)."""
    from sessions_app.services import core as services

    session = services.session_start(agent=AGENT, input=f"count to {turns}")
    return str(session.id)
