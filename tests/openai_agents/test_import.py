"""What importing the integration does. The SDK reaches nothing but the model it is given:
importing the integration and running a conversation through it in a fresh interpreter, the
program's run with tracing off as the module's docstring says (the import itself leaves the
SDK's tracing alone), opens no connection and resolves no name beyond loopback, even when
traces are flushed.
Without the SDK, the import says what to install."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ..conftest import PACKAGES, ROOT, program_env, run_python

pytestmark = pytest.mark.django_db(transaction=True)

PROGRAM = r"""
import ipaddress, json, socket, sys

attempts = open(sys.argv[1], "a")

def local(host):
    if host in ("localhost", "", None) or str(host).startswith("/"):
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False

def record(what, host):
    attempts.write(json.dumps([what, str(host)]) + "\n")
    attempts.flush()

real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
real_getaddrinfo = socket.getaddrinfo

def connect(self, address, *a):
    host = address[0] if isinstance(address, tuple) else address
    if not local(host):
        record("connect", host)
        raise OSError("network disabled by the test")
    return real_connect(self, address, *a)

def connect_ex(self, address, *a):
    host = address[0] if isinstance(address, tuple) else address
    if not local(host):
        record("connect", host)
        return 111
    return real_connect_ex(self, address, *a)

def getaddrinfo(host, *a, **k):
    if not local(host):
        record("resolve", host)
        raise socket.gaierror("network disabled by the test")
    return real_getaddrinfo(host, *a, **k)

socket.socket.connect, socket.socket.connect_ex = connect, connect_ex
socket.getaddrinfo = getaddrinfo

import django
django.setup()
import asyncio, dataclasses
from agents import Runner
from agents.tracing import get_trace_provider
from sessions_app.openai_agents.session import RespawnSession
from acme_sdk import run_config, support

session = RespawnSession("no-network")
untraced = dataclasses.replace(run_config, tracing_disabled=True)
result = asyncio.run(Runner.run(support, "loop 2", session=session, run_config=untraced))
session.close()
# What the SDK would export at exit, exported now: with tracing on, this reaches its vendor.
get_trace_provider().force_flush()
print(json.dumps({"answer": result.final_output,
                  "tracing_disabled": bool(getattr(get_trace_provider(), "_disabled", None))}))
"""


def test_import_and_run_reach_only_loopback(sdk_model, tmp_path):
    attempts = tmp_path / "attempts.jsonl"
    attempts.touch()
    env = program_env(
        PYTHONPATH=os.pathsep.join([str(PACKAGES), str(ROOT)]),
        ACME_SDK_BASE_URL=sdk_model.url + "/v1",
        # The SDK's default client would be OpenAI's: a key set, so nothing stops early.
        OPENAI_API_KEY="sk-test-not-a-key",
    )
    stdout = run_python("-c", PROGRAM, str(attempts), env=env)
    out = json.loads(stdout.strip().splitlines()[-1])
    # The import left the SDK's global switch as it was: the run's own config kept it local.
    assert out == {"answer": "Worked 2 steps.", "tracing_disabled": False}
    assert attempts.read_text() == ""
    assert len(sdk_model.requests) == 3  # the conversation did reach the local model


def test_importing_without_the_sdk_says_what_to_install():
    code = "import sys; sys.modules['agents'] = None\nimport sessions_app.openai_agents.session"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert (
        "sessions_app.openai_agents.session needs the OpenAI Agents SDK: install it with "
        "`pip install openai-agents`" in done.stderr
    )
