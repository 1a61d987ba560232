"""DATABASE_URL and DATABASE_REPLICA_URL read into Django's DATABASES entries.

dj-database-url reads every form but one: libpq's multi-host URL, the form a PostgreSQL
deployment with failover gives its clients,

    postgres://user:password@10.0.0.5:5432,10.0.0.6:5432/respawn?target_session_attrs=read-write

Each connection tries the hosts in turn and keeps the first that answers and, with
`target_session_attrs=read-write`, is the primary: after a failover the next connection
finds the promoted server. Its hosts and ports go to Django as comma-separated HOST and
PORT, which Django hands to psycopg (libpq) as they are.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import dj_database_url

POSTGRES_SCHEMES = {"postgres", "postgresql", "pgsql", "postgis"}
# libpq's values (the PostgreSQL manual, "Parameter Key Words").
TARGET_SESSION_ATTRS = {"any", "read-write", "read-only", "primary", "standby", "prefer-standby"}


class DatabaseUrlError(ValueError):
    """A database URL that cannot be read; the message names the setting and the problem."""


def _host_and_port(item: str, name: str, position: str) -> tuple[str, str]:
    """One entry of a multi-host list: `host`, `host:port`, `[v6]` or `[v6]:port`."""
    if item.startswith("["):
        host, bracket, rest = item[1:].partition("]")
        if not bracket or not host or (rest and not rest.startswith(":")):
            raise DatabaseUrlError(
                f"{name}: the {position}host {item!r} is not [address] or [address]:port"
            )
        port = rest[1:]
    else:
        host, _, port = item.partition(":")
        if ":" in port:
            raise DatabaseUrlError(
                f"{name}: the {position}host {item!r} has more than one ':' (write an IPv6 "
                "address in brackets, e.g. [::1]:5432)"
            )
    if not host:
        raise DatabaseUrlError(f"{name}: the {position}host of the list is empty ({item!r})")
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise DatabaseUrlError(
            f"{name}: the {position}host {item!r} has port {port!r}, not a number from 1 to 65535"
        )
    return host, port


def _ordinal(n: int) -> str:
    return {1: "first", 2: "second", 3: "third"}.get(n, f"{n}th")


def parse_database_url(url: str, *, name: str = "DATABASE_URL") -> dict[str, Any]:
    """Django's DATABASES entry for `url` (`name`: the setting it came from, for errors).

    A PostgreSQL URL may list several hosts (libpq's multi-host form): HOST and PORT are
    then comma-separated lists, in the URL's order, and DATABASE_URL's connections go to
    the primary among them (`target_session_attrs=read-write` unless the URL says
    otherwise; a replica URL keeps what it says)."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise DatabaseUrlError(f"{name} is not a URL: {exc}") from None
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    hosts = hostlist.split(",")
    if len(hosts) == 1:
        if parts.scheme in POSTGRES_SCHEMES and hostlist and not hostlist.startswith(":"):
            _host_and_port(hostlist, name, "")  # a port that is no port, named as such
        return _parse_one(url, name)
    if parts.scheme not in POSTGRES_SCHEMES:
        raise DatabaseUrlError(
            f"{name} names several hosts ({hostlist}): only a PostgreSQL URL (postgres://) may"
        )
    found = [_host_and_port(h, name, f"{_ordinal(n)} ") for n, h in enumerate(hosts, 1)]
    # The rest (user, password, database, options) as dj-database-url reads it, from the
    # URL with the first host alone.
    single = urlunsplit(parts._replace(netloc=f"{userinfo}{at}{hosts[0]}"))
    entry = _parse_one(single, name)
    entry["HOST"] = ",".join(host for host, _ in found)
    ports = [port for _, port in found]
    # libpq: one port for every host, or one per host (an empty one: the default, 5432).
    entry["PORT"] = ",".join(ports) if any(ports) else ""
    if name == "DATABASE_URL":
        entry.setdefault("OPTIONS", {}).setdefault("target_session_attrs", "read-write")
    return entry


def _parse_one(url: str, name: str) -> dict[str, Any]:
    try:
        entry = dj_database_url.parse(url, conn_max_age=0)
    except (ValueError, dj_database_url.ParseError) as exc:
        raise DatabaseUrlError(
            f"{name} is not a database URL (postgres://user:password@host:port/name): {exc}"
        ) from None
    attrs = entry.get("OPTIONS", {}).get("target_session_attrs")
    if attrs is not None and attrs not in TARGET_SESSION_ATTRS:
        raise DatabaseUrlError(
            f"{name}: target_session_attrs={attrs} is not one of "
            f"{', '.join(sorted(TARGET_SESSION_ATTRS))}"
        )
    return dict(entry)
