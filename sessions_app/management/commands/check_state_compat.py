"""The deploy gate: would every session that may still run load with this code?"""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from sessions_app.sdk_glue import PROGRAM_AGENTS
from sessions_app.selectors.core import CompatReport, state_compat_report


def _versions_line(report: CompatReport) -> str:
    counts = ", ".join(f"v{v}: {n}" for v, n in report.sessions_per_version.items()) or "none"
    return f"live sessions per schema version: {counts}"


def _agents_line(report: CompatReport) -> str:
    counts = (
        ", ".join(
            f"{agent} {version or '(unrecorded)'}: {n}"
            for (agent, version), n in report.sessions_per_agent_version.items()
        )
        or "none"
    )
    return f"live sessions per agent version started on: {counts}"


def _program_line(report: CompatReport) -> str:
    counts = ", ".join(
        f"{agent} ({PROGRAM_AGENTS[agent]}): {n}" for agent, n in sorted(report.by_program.items())
    )
    return f"not checked, run and checked by their own program: {counts}"


class Command(BaseCommand):
    help = (
        "Load the head checkpoint and live steps of every session that may still run (all but "
        "completed and cancelled ones) with this code, as a worker would, and check each "
        "against this code's agents (the agent exists and continues it, its agent state "
        "loads, every tool call still to run names a tool that takes its stored arguments; "
        "a LangGraph graph still has the nodes a session waits in, an OpenAI Agents SDK "
        "agent the tools its calls wait for). Sessions a program runs itself (RespawnSaver "
        "or RespawnSession under their default agent name) are counted, not checked. "
        "Exits 1 with a report of each problem. Run it with the new release before `migrate`."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--all", action="store_true", help="check completed and cancelled sessions too"
        )
        parser.add_argument("--json", action="store_true", help="print the report as JSON")

    def handle(self, *args, **options):
        report = state_compat_report(every_session=options["all"])
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    {
                        "schema_version": report.schema_version,
                        "checked": report.checked,
                        "failures": [
                            {
                                "session": f.session_id,
                                "agent": f.agent,
                                "status": f.status,
                                "where": f.where,
                                "error": f.error,
                                "incompatible_since": (
                                    f.incompatible_since.isoformat()
                                    if f.incompatible_since
                                    else None
                                ),
                            }
                            for f in report.failures
                        ],
                        "sessions_per_version": {
                            str(v): n for v, n in report.sessions_per_version.items()
                        },
                        "loads_now": report.loads_now,
                        "run_by_their_program": report.by_program,
                        "sessions_per_agent_version": [
                            {"agent": agent, "version": version, "sessions": n}
                            for (agent, version), n in report.sessions_per_agent_version.items()
                        ],
                    },
                    indent=2,
                )
            )
        else:
            self.write_report(report)
        if report.failures:
            raise CommandError(
                f"{report.failing_sessions} of {report.checked} session(s) would fail to load "
                f"with this code (schema version {report.schema_version})",
                returncode=1,
            )

    def write_report(self, report: CompatReport) -> None:
        out = self.stdout
        for failure in report.failures:
            out.write(self.style.ERROR(f"FAIL {failure.session_id}"))
            out.write(f"  agent:  {failure.agent}")
            out.write(f"  status: {failure.status}")
            out.write(f"  failed: {failure.where}")
            out.write(f"  error:  {failure.error}")
            if failure.incompatible_since:
                since = failure.incompatible_since.isoformat(timespec="seconds")
                out.write(f"  marked incompatible since {since}")
            out.write("")
        for session_id in report.loads_now:
            out.write(
                f"note: {session_id} is marked incompatible but loads with this code; "
                "`upgrade_state` clears the mark (a newer worker retries it by itself)"
            )
        if report.failures:
            out.write(
                f"{report.failing_sessions} of {report.checked} session(s) would fail to load "
                f"with this code (schema version {report.schema_version})."
            )
        else:
            out.write(
                self.style.SUCCESS(
                    f"all {report.checked} session(s) load with this code "
                    f"(schema version {report.schema_version})."
                )
            )
        out.write(_versions_line(report))
        out.write(_agents_line(report))
        if report.by_program:
            out.write(_program_line(report))
