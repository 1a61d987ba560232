"""DATABASE_URL and DATABASE_REPLICA_URL (config.database_url): libpq's multi-host form
read into comma-separated HOST and PORT that reach psycopg as they are; a bad URL refused
with an error that names the setting and the problem."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.db.utils import ConnectionHandler

from config.database_url import DatabaseUrlError, parse_database_url

from ..conftest import ROOT
from ..servers import free_port


def test_a_multi_host_url_gives_host_and_port_lists_and_the_primary_by_default():
    entry = parse_database_url(
        "postgres://app:s%40cret@10.0.0.5:5432,10.0.0.6:5433/respawn?connect_timeout=2"
    )
    assert entry["ENGINE"] == "django.db.backends.postgresql"
    assert (entry["HOST"], entry["PORT"]) == ("10.0.0.5,10.0.0.6", "5432,5433")
    assert (entry["USER"], entry["PASSWORD"], entry["NAME"]) == ("app", "s@cret", "respawn")
    assert entry["OPTIONS"] == {"connect_timeout": 2, "target_session_attrs": "read-write"}


def test_a_multi_host_url_keeps_what_it_says_and_the_replica_url_gets_no_default():
    entry = parse_database_url(
        "postgresql://postgres@[::1]:5001,db2,db3:5003/respawn?target_session_attrs=primary"
    )
    # libpq: an empty entry of the port list is the default port.
    assert (entry["HOST"], entry["PORT"]) == ("::1,db2,db3", "5001,,5003")
    assert entry["OPTIONS"] == {"target_session_attrs": "primary"}
    replica = parse_database_url("postgres://postgres@r1,r2/respawn", name="DATABASE_REPLICA_URL")
    assert (replica["HOST"], replica["PORT"]) == ("r1,r2", "")
    assert "target_session_attrs" not in replica.get("OPTIONS", {})


def test_a_single_host_url_reads_as_before():
    entry = parse_database_url("postgres://postgres@127.0.0.1:5432/respawn")
    assert (entry["HOST"], str(entry["PORT"]), entry["NAME"]) == ("127.0.0.1", "5432", "respawn")
    assert "OPTIONS" not in entry or "target_session_attrs" not in entry["OPTIONS"]
    assert parse_database_url("sqlite:////tmp/respawn.sqlite3")["NAME"] == "/tmp/respawn.sqlite3"
    # No host: libpq's default (the Unix socket), on the port given.
    assert parse_database_url("postgres://:5433/respawn")["HOST"] == ""


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgres://h1:5432,h2:x/r", "DATABASE_URL: the second host 'h2:x' has port 'x', not a"),
        ("postgres://h1,,h2/r", "DATABASE_URL: the second host of the list is empty"),
        ("postgres://h1:99999/r", "DATABASE_URL: the host 'h1:99999' has port '99999'"),
        ("postgres://h1,fe80::1:5432/r", "has more than one ':' (write an IPv6 address in"),
        ("postgres://h1,[::1]x/r", "DATABASE_URL: the second host '[::1]x' is not [address]"),
        ("mysql://h1,h2/r", "DATABASE_URL names several hosts (h1,h2): only a PostgreSQL"),
        ("postgres://h1/r?target_session_attrs=readwrite", "target_session_attrs=readwrite is"),
        ("postgress://h1/r", "DATABASE_URL is not a database URL (postgres://user:password@"),
    ],
)
def test_a_bad_url_is_refused_naming_the_problem(url, message):
    with pytest.raises(DatabaseUrlError) as raised:
        parse_database_url(url)
    assert message in str(raised.value)


def _settings_of(**env: str) -> subprocess.CompletedProcess:
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "d = s.DATABASES; print(d['default']['HOST'], d['default']['PORT'], "
        "d['default']['OPTIONS'].get('target_session_attrs'), "
        "d.get('replica', {}).get('HOST'))"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings_test", **env},
        capture_output=True,
        text=True,
    )


def test_the_settings_read_multi_host_urls_and_refuse_a_bad_one_clearly():
    result = _settings_of(
        DATABASE_URL="postgres://postgres@10.0.0.5:5432,10.0.0.6:5432/respawn",
        DATABASE_REPLICA_URL="postgres://postgres@10.0.0.6,10.0.0.7/respawn",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["10.0.0.5,10.0.0.6", "5432,5432", "read-write",
                                     "10.0.0.6,10.0.0.7"]  # fmt: skip
    bad = _settings_of(DATABASE_URL="postgres://postgres@10.0.0.5:5432,10.0.0.6:x/respawn")
    assert bad.returncode != 0
    assert "DATABASE_URL: the second host '10.0.0.6:x' has port 'x'" in bad.stderr
    assert "Traceback" not in bad.stderr
    bad = _settings_of(DATABASE_REPLICA_URL="postgres://postgres@r1,r2:0/respawn")
    assert "DATABASE_REPLICA_URL: the second host 'r2:0' has port '0'" in bad.stderr


@pytest.mark.django_db
def test_a_django_connection_from_a_multi_host_url_skips_a_dead_host_for_the_primary(settings):
    """The lists reach psycopg (libpq) as they are: with nothing listening on the first
    host's port, the connection is made to the second, the primary."""
    from django.db import connection

    own = connection.settings_dict
    dead = free_port()
    url = f"postgres://{own['USER']}@127.0.0.1:{dead},{own['HOST']}:{own['PORT']}/{own['NAME']}"
    handler = ConnectionHandler({"default": parse_database_url(url)})
    try:
        wrapper = handler["default"]
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT inet_server_port(), pg_is_in_recovery()")
            assert cursor.fetchone() == (int(own["PORT"]), False)
        params = wrapper.connection.info.get_parameters()
        assert params["target_session_attrs"] == "read-write"
        assert wrapper.connection.info.port == int(own["PORT"])
    finally:
        handler.close_all()
