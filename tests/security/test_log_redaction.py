"""One redaction for every log line: whatever logger a line comes from (an agent's own, a
library's, Django's, RQ's, Python's warnings, gunicorn's access and error logs), the secrets
of the corpus (tests/security/test_secrets_everywhere.py: every shape the README lists) are
not in it, and the line itself is still there. Real processes with the project's logging
configuration, a real worker running a team's agent that logs its tool's arguments."""

from __future__ import annotations

import json
import subprocess
import sys
from urllib.parse import quote, quote_plus

import pytest

from sessions_app.services.core import session_start
from tests.conftest import ROOT, program_env, wait_final

from .test_secrets_everywhere import NEVER, PEM, PGP, SECRET_SETTINGS, SECRETS

LINES = [text for _, text in SECRETS.values()] + [PEM, PGP]
ONE_LINE = " ".join(text for _, text in SECRETS.values())

# Each line is logged through each of these, as a message, as an argument and inside an
# exception's traceback.
EMIT = """
import json, logging, sys, warnings
lines = json.loads(sys.stdin.read())
loggers = ["acme_agents.tools", "respawn.jobs", "django.request", "rq.worker", "urllib3", ""]
for n, text in enumerate(lines):
    for name in loggers:
        log = logging.getLogger(name)
        log.warning("line %d via %s: " + text.replace("%", "%%"), n, name or "root")
        log.warning("line %d via %s (arg): %s", n, name or "root", text)
        try:
            raise ValueError(text)
        except ValueError:
            log.exception("line %d via %s (traceback)", n, name or "root")
    warnings.warn(f"line {n} via warnings: {text}")
"""


def _emit(setup: str, lines: list[str], settings_module: str = "config.settings") -> str:
    done = subprocess.run(
        [sys.executable, "-c", setup + EMIT],
        input=json.dumps(lines),
        cwd=ROOT,
        env=program_env(DJANGO_SETTINGS_MODULE=settings_module, **SECRET_SETTINGS),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


def _assert_clean(output: str, emitted: int) -> None:
    leaked = [secret for secret in NEVER if secret in output]
    assert not leaked, f"in the log: {leaked}"
    # Nothing was dropped to hide it: every line is there, redacted.
    for n in range(emitted):
        for name in ("acme_agents.tools", "respawn.jobs", "django.request", "rq.worker", "root"):
            assert f"line {n} via {name}: " in output
            assert f"line {n} via {name} (arg): " in output
            assert f"line {n} via {name} (traceback)" in output
        assert f"line {n} via warnings: " in output
    assert "[REDACTED:" in output


@pytest.mark.parametrize("settings_module", ["config.settings", "config.settings_test"])
def test_every_logger_of_a_web_or_worker_process_is_redacted(settings_module):
    setup = "import django\ndjango.setup()\n"
    _assert_clean(_emit(setup, LINES, settings_module), len(LINES))


def test_gunicorns_logs_and_every_other_logger_under_it_are_redacted():
    """config/gunicorn.py's logging, as gunicorn applies it, with the app loaded in it."""
    setup = (
        "import logging.config, runpy, django\n"
        "logging.config.dictConfig(runpy.run_path('config/gunicorn.py')['logconfig_dict'])\n"
        "django.setup()\n"  # a gunicorn worker loads the app after gunicorn's logging
    )
    output = _emit(setup, LINES)
    _assert_clean(output, len(LINES))
    # Request lines: a query string percent-encoded once, and twice as the log-in page's
    # `next` carries it after a redirect.
    requests = []
    for text in LINES:
        once = f"/sessions/?q={quote_plus(text)}"
        requests += [once, f"/login/?next={quote(once, safe='')}"]
    access = (
        "import logging.config, runpy, json, sys\n"
        "logging.config.dictConfig(runpy.run_path('config/gunicorn.py')['logconfig_dict'])\n"
        "for path in json.loads(sys.stdin.read()):\n"
        "    logging.getLogger('gunicorn.access').info('10.0.0.5 \"GET %s HTTP/1.1\" 200', path)\n"
        "raise SystemExit\n"
    )
    logged = _emit(access, requests)
    leaked = [secret for secret in NEVER if secret in logged]
    assert not leaked, f"in the access log: {leaked}"
    assert logged.count('"GET /') == len(requests)


@pytest.mark.django_db(transaction=True)
def test_an_agents_own_logger_in_a_real_worker_is_redacted(start_worker, settings):
    settings.RESPAWN_AGENTS = ["acme_agents:agents_v1"]
    session = session_start(agent="acme", input=f"open ticket {ONE_LINE}")
    worker = start_worker(RESPAWN_AGENTS="acme_agents:agents_v1", **SECRET_SETTINGS)
    wait_final([session], timeout=60)
    worker.stop()
    log = worker.log()
    assert "opening ticket" in log  # the agent's line is there
    leaked = [secret for secret in NEVER if secret in log]
    assert not leaked, f"in the worker's log: {leaked}"
