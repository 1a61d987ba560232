"""The README's client script, run for real: HTTP server, API token, a real worker."""

import subprocess
import sys
from pathlib import Path

import pytest

from sessions_app.models import ApiToken

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_example_client_runs_a_two_message_conversation(live_server, start_worker, users):
    start_worker()
    _, token = ApiToken.issue(users["operator"])
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "client.py"), live_server.url, token],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("started ")
    assert lines[1].startswith("answer 1: (12*7)+3 = 87. Saved as note note-")
    assert lines[2] == "answer 2: 6*7 = 42."
    assert lines[3].startswith("steps: 1:user 2:system 3:model")
    assert token not in out.stdout + out.stderr
