"""System checks: a deployment whose agents cannot load does not start.

`manage.py check`, `runserver`, `rqworker` and every other management command run the
checks before they start; the WSGI and ASGI entry points run this one too (gunicorn runs
no checks of its own). So a wrong `RESPAWN_AGENTS` path, an attribute that is not an
agent, two agents with one name or a tool whose signature cannot become a schema stops
the process with the path and the problem, never a job at run time.
"""

from __future__ import annotations

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from . import runtime

# Problem codes of agent_runtime.discovery -> check ids.
CHECK_IDS = {
    "path": "respawn.E001",
    "import": "respawn.E002",
    "attribute": "respawn.E003",
    "not_agent": "respawn.E004",
    "call": "respawn.E005",
    "agent": "respawn.E006",
    "duplicate": "respawn.E007",
    "model": "respawn.E008",
}

HINTS = {
    "path": "Each RESPAWN_AGENTS entry is 'package.module:attribute'.",
    "import": "Install the package (or put it on PYTHONPATH) and fix the error in its code.",
    "attribute": "Name an Agent, a list of agents, or a function returning them.",
    "not_agent": "Build agents with agent_runtime.Agent(...).",
    "duplicate": "Agent names are unique across RESPAWN_AGENTS and the installed packages.",
    "model": "Name models 'provider:model' with a known provider, or register_provider().",
}


@checks.register("respawn")
def check_agents(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    found = runtime.discovered()
    messages: list[checks.CheckMessage] = [
        checks.Error(
            str(problem),
            hint=HINTS.get(problem.code),
            obj=f"RESPAWN_AGENTS={','.join(settings.RESPAWN_AGENTS)}",
            id=CHECK_IDS.get(problem.code, "respawn.E099"),
        )
        for problem in found.problems
    ]
    if not found.problems and not found.agents:
        messages.append(
            checks.Warning(
                "no agents are configured: RESPAWN_AGENTS is empty and no installed package "
                "declares the respawn.agents entry point",
                hint="Set RESPAWN_AGENTS=your_package.agents:agents (or demo_agents:agents).",
                id="respawn.W001",
            )
        )
    return messages


@checks.register("respawn")
def check_retention(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """A retention policy that cannot be applied is refused before anything runs."""
    from .upkeep.retention import PolicyError, parse_policy

    problem: str | None = settings.RESPAWN_RETENTION_PROBLEM
    if not problem:
        try:
            policy = parse_policy(settings.RESPAWN_RETENTION)
        except PolicyError as exc:
            problem = str(exc)
        else:
            archive = policy.archive
            if archive is not None:
                problem = archive.problem()
    if not problem:
        return []
    return [
        checks.Error(
            f"RESPAWN_RETENTION: {problem}",
            hint="See the README's Retention section for the policy format.",
            id="respawn.E020",
        )
    ]


@checks.register("respawn")
def check_prices(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """A price table that cannot be read is refused before a worker records a cost."""
    from agent_runtime.pricing import PriceTableError, load_price_table

    try:
        load_price_table(settings.RESPAWN_PRICES)
    except PriceTableError as exc:
        return [
            checks.Error(
                str(exc),
                hint='RESPAWN_PRICES: {"provider:model": {"input": 2.5, "output": 10, '
                '"cache_read": 1.25, "cache_write": 0}} (US dollars per million tokens), '
                "inline or in a file",
                id="respawn.E030",
            )
        ]
    return []


@checks.register("respawn")
def check_attention_targets(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """Targets for "needs attention" that cannot be read are refused before anything runs
    (the page and the alert rules read them on every request)."""
    from .selectors.core import ATTENTION_TARGETS, parse_attention_targets

    try:
        parse_attention_targets(settings.RESPAWN_ATTENTION_TARGETS)
    except ValueError as exc:
        return [
            checks.Error(
                f"RESPAWN_ATTENTION_TARGETS: {exc}",
                hint='A JSON object of section: seconds, e.g. {"stuck": 600, "approvals": 7200};'
                f" sections: {', '.join(ATTENTION_TARGETS)}.",
                id="respawn.E032",
            )
        ]
    return []


@checks.register("respawn")
def check_tracing(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    """OTEL_* variables that ask for traces this installation cannot send."""
    from .telemetry import otel_requested, tracer_from_environment

    if not otel_requested():
        return []
    try:
        tracer_from_environment()
    except ImportError as exc:
        problem = f"the OpenTelemetry SDK is not installed ({exc.name or exc})"
        hint = 'pip install "respawn[otel]", or unset OTEL_TRACES_EXPORTER and the OTLP endpoint'
    except ValueError as exc:
        problem, hint = str(exc), "OTEL_TRACES_EXPORTER=otlp (or console)"
    else:
        return []
    return [checks.Error(f"traces are asked for, but {problem}", hint=hint, id="respawn.E031")]


def refuse_to_start_on_agent_errors() -> None:
    """For entry points that run no checks themselves (gunicorn through config.wsgi)."""
    errors = [m for m in check_agents() if m.is_serious()]
    if errors:
        raise ImproperlyConfigured(
            "Respawn cannot start: " + "; ".join(f"{m.id}: {m.msg}" for m in errors)
        )


@receiver(setting_changed)
def _agents_setting_changed(setting: str, **kwargs) -> None:
    if setting in ("RESPAWN_AGENTS", "RESPAWN_AGENT_ENTRY_POINTS"):
        runtime.reset_agents()
