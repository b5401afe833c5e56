"""What a service prints when it cannot start: the variable or the server at fault, in one
line each, instead of a traceback."""

from __future__ import annotations

from sqlalchemy.exc import ArgumentError

from qshare import dburl

CANNOT_START = (OSError, ArgumentError)
"""Failures of a service's first steps that its settings explain: Postgres or NATS out of
reach, an identity NATS refused or whose password file is missing (PermissionError and
FileNotFoundError are OSErrors), a database URL SQLAlchemy cannot use."""


def cannot_start(exc: BaseException, env_prefix: str, database_url: str) -> list[str]:
    """Why a service stopped while starting; when Postgres is the cause, the database URL it
    used (without its password) and the form it takes."""
    lines = [f"cannot start: {exc}"]
    if isinstance(exc, (ArgumentError, ConnectionRefusedError)):
        lines.append(
            f"{env_prefix}DATABASE_URL is {dburl.shown(database_url)}; the form is {dburl.FORM}"
        )
    return lines
