"""A real web server process, configured as in production: pooled connections."""

import concurrent.futures
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from sessions_app.models import ApiToken
from sessions_app.services.core import session_start

from ..servers import free_port

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_pooled_web_process_serves_concurrent_requests(worker_env, users):
    session = session_start(agent="echo", input="hi")
    _, token = ApiToken.issue(users["viewer"])
    port = free_port()
    env = {**worker_env, "RESPAWN_DB_POOL": "1", "DJANGO_SETTINGS_MODULE": "config.settings_test"}
    server = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/login/", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    pytest.fail("the web server did not come up")
                time.sleep(0.2)
        check = subprocess.run(
            [
                sys.executable,
                "-c",
                "from django.conf import settings; import django; django.setup(); "
                "print(settings.DATABASES['default'].get('OPTIONS', {}).get('pool'))",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        assert "max_size" in check.stdout, check.stderr

        def get(_):
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/api/sessions/{session.id}",
                headers={"Authorization": f"Bearer {token}"},
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read()

        with concurrent.futures.ThreadPoolExecutor(max_workers=12) as pool:
            results = list(pool.map(get, range(60)))
        assert {status for status, _ in results} == {200}
        assert all(str(session.id).encode() in body for _, body in results)
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert os.environ.get("RESPAWN_DB_POOL") == "0"  # the test process itself never pooled
