"""Database URLs as people write them (`postgres://` and `postgresql://`, as psql and hosting
providers give them, libpq's several failover hosts `HOST1:PORT1,HOST2:PORT2` too) turned into
the SQLAlchemy asyncpg form the services connect with."""

from __future__ import annotations

import os
import re
from typing import Annotated
from urllib.parse import unquote

from pydantic import AfterValidator
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

DRIVER = "postgresql+asyncpg"
SCHEMES = frozenset({"postgres", "postgresql", DRIVER})
FORM = (
    "postgresql://USER:PASSWORD@HOST:PORT/DATABASE "
    "(postgres:// and postgresql+asyncpg:// are read too)"
)


def normalised(url: str) -> str:
    """`url` in the asyncpg form; ValueError naming what is wrong when it is not a Postgres
    URL. libpq's `sslmode` becomes asyncpg's `ssl` (same values), its several hosts
    `h1:5432,h2:5433` (or `?host=h1,h2&port=5432,5433`) the repeated
    `?host=h1:5432&host=h2:5433` SQLAlchemy's asyncpg dialect takes (asyncpg tries them in
    turn). Every port is checked here, not at the first connection."""
    parsed = _parsed(url)
    if parsed.drivername not in SCHEMES:
        raise ValueError(f"{parsed.drivername}:// is not a Postgres URL; the form is {FORM}")
    query = _host_lists(_asyncpg_query(dict(parsed.query)))
    _check_query_ports(query)
    return parsed.set(drivername=DRIVER, query=query).render_as_string(hide_password=False)


TAKEN = ("host", "port", "ssl", "target_session_attrs", "passfile", "krbsrvname", "gsslib",
         "prepared_statement_cache_size")  # fmt: skip
"""The URL options the asyncpg driver takes (SQLAlchemy hands each to `asyncpg.connect` as
a keyword: any other one would fail every connection with a TypeError)."""


def _asyncpg_query(query: dict[str, str | tuple[str, ...]]) -> dict[str, str | tuple[str, ...]]:
    if "sslmode" in query:
        if "ssl" in query:
            raise ValueError("?sslmode= and ?ssl= both given; keep one")
        query["ssl"] = query.pop("sslmode")
    refused = sorted(set(query) - set(TAKEN))
    if refused:
        raise ValueError(
            f"{', '.join(f'?{name}=' for name in refused)}: not an option the asyncpg driver "
            f"takes from a URL; it takes {', '.join(TAKEN)} and sslmode (as ssl)"
        )
    return query


def _host_lists(query: dict[str, str | tuple[str, ...]]) -> dict[str, str | tuple[str, ...]]:
    """libpq's `?host=h1,h2` with `?port=` (none: each on 5432; one: all on it; else one
    for each) as the repeated `?host=h1:p1&host=h2:p2` (SQLAlchemy's asyncpg dialect would
    fail every connection on the first two)."""
    host = query.get("host")
    if not isinstance(host, str) or "," not in host:
        return query
    hosts, ports = host.split(","), _values(query.pop("port", None))
    if len(ports) < 2:
        ports = ports * len(hosts) or [default_port()] * len(hosts)
    if len(ports) != len(hosts):
        raise ValueError(f"{len(hosts)} hosts and {len(ports)} ports in ?host= and ?port=: "
                         "give one port for all, or one for each host")  # fmt: skip
    if not all(hosts):
        raise ValueError(f"an empty host in ?host=; the form is {SEVERAL}")
    return query | {
        "host": tuple(f"{h}:{p or default_port()}" for h, p in zip(hosts, ports, strict=True))
    }


def _check_query_ports(query: dict[str, str | tuple[str, ...]]) -> None:
    """The ports of `?port=` (libpq's comma-separated list, one a host) or of the
    `?host=HOST:PORT`s checked as the URL's own (an IPv6 address is no `HOST:PORT`)."""
    hosts, ports = _values(query.get("host")), _values(query.get("port"))
    for i, port in enumerate(ports):
        _check_port(hosts[i] if i < len(hosts) else "(default)", port)
    for token in [] if ports else hosts:
        if token.count(":") == 1:
            _check_port(*token.split(":"))


def _values(value: str | tuple[str, ...] | None) -> list[str]:
    items = (value,) if isinstance(value, str) else (value or ())
    return [part for item in items for part in item.split(",")]


def shown(url: str) -> str:
    """`url` with its password hidden, for messages; also where it is not a URL or its
    password holds an '@' not percent-encoded (all up to the last '@' of the rest is hidden),
    and libpq's `password=` (keyword form or query option)."""
    scheme, sep, rest = url.partition("://") if "://" in url else ("", "", url)
    userinfo, at, after = rest.rpartition("@")
    if at and ":" in userinfo:
        rest = f"{userinfo.split(':', 1)[0]}:***@{after}"
    return _PASSWORD_OPTION.sub(r"\1***", scheme + sep + rest)


_PASSWORD_OPTION = re.compile(r"(password=)[^&\s]*", re.IGNORECASE)


def _parsed(url: str) -> URL:
    single, hosts = _several_hosts(url)
    try:
        parsed = make_url(single)
    except (ArgumentError, ValueError):
        raise ValueError(f"not a database URL; the form is {FORM}") from None
    if not hosts:
        _check_port(parsed.host or "", "" if parsed.port is None else str(parsed.port))
        return parsed
    clash = sorted({"host", "port"} & set(parsed.query))
    if clash:
        raise ValueError(f"several hosts and ?{clash[0]}= both given; keep one")
    return parsed.set(query={"host": hosts} | dict(parsed.query))


_NETLOC = re.compile(
    r"(?P<head>[^:/?#]+://(?:[^:/]*(?::[^@]*)?@)?)(?P<hosts>[^/?#@]*)(?P<tail>.*)", re.S
)
"""A URL: scheme and user info, read as SQLAlchemy reads it (the user name all up to the
password's ':', an '@' in it too, as some hosting providers' `user@server` names; the
password all up to the next '@'), its hosts (libpq: comma-separated), then path and query."""


def default_port() -> str:
    """libpq's port for a host given without one: `$PGPORT`, else 5432 (the asyncpg dialect
    wants every port of several hosts written out)."""
    port = os.environ.get("PGPORT") or "5432"
    if not _is_port(port):
        raise ValueError(f"PGPORT={port!r} is not a port (1 to 65535)")
    return port


def _several_hosts(url: str) -> tuple[str, tuple[str, ...]]:
    """`url` without its hosts and its `HOST:PORT`s when it names several (libpq's form,
    which SQLAlchemy's URL parser cannot read); else `url` as it is and none."""
    found = _NETLOC.fullmatch(url)
    if found is None:
        return url, ()
    if found["tail"].startswith("@"):
        raise ValueError(
            "an '@' in the user name or password: percent-encode it (%40); the form is " + FORM
        )
    if "," not in found["hosts"]:
        return url, ()
    if "[" in found["hosts"]:
        raise ValueError(
            "an IPv6 address among several hosts: the asyncpg driver cannot take one there; "
            "give that host's name, or the address alone as the only host"
        )
    hosts = tuple(_host_and_port(token) for token in found["hosts"].split(","))
    return found["head"] + found["tail"], hosts


def _host_and_port(token: str) -> str:
    host, _, port = token.partition(":")
    if not host:
        raise ValueError(f"an empty host in the hosts list; the form is {SEVERAL}")
    _check_port(unquote(host), port)
    return f"{unquote(host)}:{port or default_port()}"


def _check_port(host: str, port: str) -> None:
    """ValueError where `port` (empty: the default) is not one a connection can use: asyncpg
    raises OverflowError past 65535 and takes 0 for 5432."""
    if not port or _is_port(port):
        return
    if not re.fullmatch("[0-9]+", port):
        raise ValueError(f"{port!r} is not a port (of host {host}); the form is {SEVERAL}")
    raise ValueError(f"port {port} of host {host} is out of range (1 to 65535)")


def _is_port(port: str) -> bool:
    """ASCII digits naming 1 to 65535."""
    return re.fullmatch("[0-9]+", port) is not None and 0 < int(port) < 65536


SEVERAL = "postgresql://USER:PASSWORD@HOST1:PORT1,HOST2:PORT2/DATABASE"


DatabaseUrl = Annotated[str, AfterValidator(normalised)]
"""A settings field holding a Postgres URL, stored in the asyncpg form."""
