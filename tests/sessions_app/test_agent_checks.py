"""A deployment whose agents cannot load does not start: `manage.py check`, `rqworker` and
the WSGI entry point (gunicorn) all refuse, naming the path and the problem."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from sessions_app import runtime

from ..conftest import PACKAGES, ROOT


@pytest.mark.parametrize(
    "paths, check_id, message",
    [
        (["acme_agents"], "respawn.E001", "must look like 'package.module:attribute'"),
        (["no_such_package:agents"], "respawn.E002", "no module named 'no_such_package'"),
        (["acme_agents:nope"], "respawn.E003", "has no attribute 'nope'"),
        (["acme_broken.shapes:number"], "respawn.E004", "is int, not an agent"),
        (["acme_broken.shapes:raises"], "respawn.E005", "raised RuntimeError"),
        (["acme_broken.shapes:bad_name"], "respawn.E006", "name must be 1-100 letters"),
        (
            ["acme_agents:agents_v1", "acme_agents:agents_v2"],
            "respawn.E007",
            "two agents are named 'acme'",
        ),
        (["acme_broken.shapes:unknown_provider"], "respawn.E008", "unknown model provider"),
        (["acme_broken.untyped_tool:agents"], "respawn.E002", "parameter 'query' needs a type"),
        (["acme_broken.unschema_tool:agents"], "respawn.E002", "cannot become a JSON schema"),
    ],
)
def test_each_misconfiguration_is_a_system_check_error(settings, paths, check_id, message):
    settings.RESPAWN_AGENTS = paths
    with pytest.raises(SystemCheckError) as raised:
        call_command("check")
    text = str(raised.value)
    assert check_id in text and message in text
    assert f"RESPAWN_AGENTS entry {paths[-1]!r}" in text


def test_a_good_configuration_passes_and_replaces_the_demo_agents(settings):
    settings.RESPAWN_AGENTS = ["acme_agents:agents_v1"]
    call_command("check")
    assert runtime.agent_registry().names() == ["acme"]
    settings.RESPAWN_AGENTS = ["demo_agents:agents", "acme_agents:agents_v2"]
    assert "acme" in runtime.agent_registry() and "demo" in runtime.agent_registry()
    assert runtime.agent_version("acme") == "2"


def test_no_agents_at_all_is_a_warning(settings):
    settings.RESPAWN_AGENTS = []
    settings.RESPAWN_AGENT_ENTRY_POINTS = False
    from sessions_app.checks import check_agents

    [warning] = check_agents()
    assert warning.id == "respawn.W001" and not warning.is_serious()


def _python(*args: str, agents: str) -> subprocess.CompletedProcess:
    """A process of its own (as a deployment starts one) with RESPAWN_AGENTS=agents."""
    import os

    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings_test",
        "PYTHONPATH": str(PACKAGES),
        "RESPAWN_AGENTS": agents,
    }
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def test_rqworker_refuses_to_start_with_an_agent_that_cannot_load():
    done = _python(
        "manage.py", "rqworker", "respawn-never-served", agents="acme_broken.untyped_tool:agents"
    )
    assert done.returncode != 0
    assert "respawn.E002" in done.stderr
    assert "parameter 'query' needs a type hint" in done.stderr


def test_the_wsgi_application_refuses_to_start_with_an_agent_that_cannot_load():
    done = _python("-c", "import config.wsgi", agents="acme_agents:nope")
    assert done.returncode != 0
    assert "ImproperlyConfigured: Respawn cannot start: respawn.E003" in done.stderr
    ok = _python("-c", "import config.wsgi", agents="acme_agents:agents_v1")
    assert ok.returncode == 0, ok.stderr
