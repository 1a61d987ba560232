"""`make run` (config.devrun) when one is already running, or its port is taken: one line
saying so, a non-zero exit, and nothing started, written or removed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from config import devrun

ROOT = Path(__file__).resolve().parents[2]


def _env(var: Path, port: int) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL", "REDIS_SENTINELS", "DJANGO_SETTINGS_MODULE")
    }
    return {**env, "RESPAWN_VAR_DIR": str(var), "RESPAWN_PORT": str(port)}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _make_run(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "config.devrun"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_a_second_make_run_names_the_first_and_touches_nothing(tmp_path):
    var = tmp_path / "var"
    var.mkdir()
    first_port = _free_port()
    # The first run: holds var/ as a running `make run` does, with its Redis URL written.
    (var / "redis.url").write_text("redis://127.0.0.1:6390/0\n")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from config import devrun; "
            f"held = devrun.claim_instance('http://127.0.0.1:{first_port}/sessions/'); "
            "print('held', flush=True); time.sleep(120)",
        ],
        cwd=ROOT,
        env=_env(var, first_port),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        second = _make_run(_env(var, _free_port()))
    finally:
        holder.kill()
        holder.wait()
    assert second.returncode == 1
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1, second.stderr
    assert f"already running from {var} at http://127.0.0.1:{first_port}/sessions/" in lines[0]
    assert "Respawn is running" not in second.stdout  # no banner
    # The first one's files are as it left them; nothing was migrated or started.
    assert (var / "redis.url").read_text() == "redis://127.0.0.1:6390/0\n"
    assert not (var / "respawn.sqlite3").exists()
    assert not (var / "redis.log").exists()


def test_a_taken_port_is_named_before_anything_starts(tmp_path):
    var = tmp_path / "var"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        run = _make_run(_env(var, port))
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert f"127.0.0.1:{port} is in use by another program" in lines[0]
    assert "RESPAWN_PORT" in lines[0]
    assert not (var / "redis.url").exists()
    assert not (var / "respawn.sqlite3").exists()


def test_the_lock_goes_with_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(devrun, "VAR", tmp_path)
    monkeypatch.setattr(devrun, "INSTANCE_FILE", tmp_path / "run.lock")
    first = devrun.claim_instance("http://127.0.0.1:1/sessions/")
    first.close()  # the run ended (however: the lock goes with the file)
    devrun.claim_instance("http://127.0.0.1:2/sessions/").close()


def test_make_run_serves_the_dashboards_own_error_pages():
    # DEBUG off unless asked for: Django's debug pages are for DEBUG=1 make run.
    assert devrun.child_environment({})["DEBUG"] == "0"
    assert devrun.child_environment({})["RESPAWN_PRODUCTION"] == "0"
    assert devrun.child_environment({"DEBUG": "1"})["DEBUG"] == "1"
