#!/usr/bin/env bash
# Make sure the PostgreSQL and Redis servers the tests use answer. Starts local servers
# that are installed but stopped; says what to install when they are missing. Installs
# Debian's Chromium (browser tests), PgBouncer (pooler tests) and faketime (clock-skew
# tests) when they are missing.
set -euo pipefail

db_url="${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/respawn}"
redis_url="${TEST_REDIS_URL:-redis://127.0.0.1:6379/15}"

hostport() {  # scheme://[user@]host:port/... -> "host port"
    local rest="${1#*://}"; rest="${rest#*@}"; rest="${rest%%/*}"
    local host="${rest%%:*}" port="${rest##*:}"
    [ "$port" = "$rest" ] && port="$2"
    echo "$host" "$port"
}

is_local() { [ "$1" = "127.0.0.1" ] || [ "$1" = "localhost" ] || [ "$1" = "::1" ]; }

port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# Install Debian's package $1 (what for: $2) as root with apt-get; else say how (and, with
# $3, what else will do) and stop.
debian_install() {
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing Debian's $1 for $2"
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >/dev/null
    else
        local end="."
        [ -z "${3:-}" ] || end=","
        echo "$1 is not installed. Install it (Debian/Ubuntu: sudo apt-get install $1)$end" >&2
        [ -z "${3:-}" ] || echo "$3" >&2
        exit 1
    fi
}

wait_port() {
    for _ in $(seq 1 60); do port_open "$1" "$2" && return 0; sleep 0.5; done
    return 1
}

read -r pg_host pg_port < <(hostport "$db_url" 5432)
if ! port_open "$pg_host" "$pg_port"; then
    if ! is_local "$pg_host"; then
        echo "PostgreSQL at $pg_host:$pg_port does not answer (TEST_DATABASE_URL=$db_url)" >&2; exit 1
    fi
    if command -v pg_ctlcluster >/dev/null 2>&1 && ls /etc/postgresql/*/main >/dev/null 2>&1; then
        version="$(ls /etc/postgresql | sort -V | tail -1)"
        echo "starting PostgreSQL $version (installed but stopped)"
        pg_ctlcluster --skip-systemctl-redirect "$version" main start
    elif command -v pg_ctl >/dev/null 2>&1 && [ -n "${PGDATA:-}" ]; then
        echo "starting PostgreSQL from PGDATA=$PGDATA"
        pg_ctl -D "$PGDATA" -l "$PGDATA/server.log" start
    else
        echo "PostgreSQL is not installed. Install it (Debian/Ubuntu: apt-get install postgresql)," >&2
        echo "or point TEST_DATABASE_URL at a server that trusts user postgres." >&2
        exit 1
    fi
    wait_port "$pg_host" "$pg_port" || { echo "PostgreSQL did not come up on $pg_host:$pg_port" >&2; exit 1; }
fi

read -r redis_host redis_port < <(hostport "$redis_url" 6379)
if ! port_open "$redis_host" "$redis_port"; then
    if ! is_local "$redis_host"; then
        echo "Redis at $redis_host:$redis_port does not answer (TEST_REDIS_URL=$redis_url)" >&2; exit 1
    fi
    if command -v redis-server >/dev/null 2>&1; then
        echo "starting redis-server on $redis_host:$redis_port (installed but stopped)"
        mkdir -p /tmp/respawn-redis
        redis-server --daemonize yes --bind 127.0.0.1 -::1 --port "$redis_port" --save "" \
            --appendonly no --dir /tmp/respawn-redis --logfile /tmp/respawn-redis/redis.log
    else
        echo "Redis is not installed. Install it (Debian/Ubuntu: apt-get install redis-server)," >&2
        echo "or point TEST_REDIS_URL at a running server." >&2
        exit 1
    fi
    wait_port "$redis_host" "$redis_port" || { echo "Redis did not come up on $redis_host:$redis_port" >&2; exit 1; }
fi
echo "PostgreSQL $pg_host:$pg_port and Redis $redis_host:$redis_port answer"

# The browser tests drive Debian's Chromium (no browser download step exists).
chromium_bin="${RESPAWN_CHROMIUM:-$(command -v chromium || true)}"
if [ -z "$chromium_bin" ] || [ ! -x "$chromium_bin" ]; then
    debian_install chromium "the browser tests" "or set RESPAWN_CHROMIUM to a Chromium binary."
fi
echo "Chromium: $(command -v chromium || echo "$RESPAWN_CHROMIUM")"

# The pooler tests start Debian's PgBouncer in transaction mode (tests/servers.py); they
# need PostgreSQL's server binaries too (initdb, pg_basebackup) for the replica tests.
pgbouncer_bin="$(command -v pgbouncer || { [ -x /usr/sbin/pgbouncer ] && echo /usr/sbin/pgbouncer; } || true)"
if [ -z "$pgbouncer_bin" ]; then
    # The package's own service is not wanted: the tests start their own instances.
    debian_install pgbouncer "the pooler tests"
    pgbouncer_bin="$(command -v pgbouncer || echo /usr/sbin/pgbouncer)"
fi
echo "PgBouncer: $pgbouncer_bin ($("$pgbouncer_bin" --version | head -1))"
# The clock-skew tests run programs whose clock is minutes off under Debian's faketime.
if ! command -v faketime >/dev/null 2>&1; then
    debian_install faketime "the clock-skew tests"
fi
echo "faketime: $(command -v faketime)"
# The failover test runs Debian's pg_auto_failover (a monitor and two data nodes, from the
# newest installed PostgreSQL's binaries) and kills its primary.
pg_major="$(ls /usr/lib/postgresql 2>/dev/null | sort -n | tail -1 || true)"
if ! command -v pg_autoctl >/dev/null 2>&1 || [ ! -e "/usr/lib/postgresql/${pg_major}/lib/pgautofailover.so" ]; then
    debian_install "postgresql-${pg_major:-15}-auto-failover" "the failover test"
fi
echo "pg_auto_failover: $(pg_autoctl --version 2>/dev/null | head -1)"
if ! ls /usr/lib/postgresql/*/bin/pg_basebackup >/dev/null 2>&1 && ! command -v pg_basebackup >/dev/null 2>&1; then
    echo "PostgreSQL's server binaries (initdb, pg_ctl, pg_basebackup) are missing." >&2
    echo "Install them (Debian/Ubuntu: apt-get install postgresql) or set RESPAWN_PG_BIN." >&2
    exit 1
fi
