"""Tells an outage of Postgres or NATS (answer 503, retry later) from a bug (answer 500)."""

from __future__ import annotations

import asyncpg  # type: ignore[import-untyped]
import nats.errors
from sqlalchemy import exc as sa

RETRY_AFTER_S = 5
"""What a 503 tells the caller to wait before trying again."""

_OUTAGE_TYPES: tuple[type[BaseException], ...] = (
    OSError,  # connection refused or reset, socket gone (ConnectionError is one)
    TimeoutError,
    sa.TimeoutError,  # no pooled connection came free
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.TooManyConnectionsError,
    asyncpg.InterfaceError,  # the connection closed under a statement
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.ConnectionDrainingError,
    nats.errors.NoServersError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.FlushTimeoutError,
)
OUTAGE_BASES: tuple[type[Exception], ...] = (
    sa.SQLAlchemyError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    OSError,
    TimeoutError,
    nats.errors.Error,
)
"""The exception types under which an outage can surface (a web framework's handlers)."""
_OUTAGE_SQLSTATES = ("08", "57P01", "57P02", "57P03", "53300")


def is_outage(error: BaseException) -> bool:
    """True when `error`, or what caused it, means a server is unreachable or restarting."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _is_outage_itself(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def _is_outage_itself(error: BaseException) -> bool:
    if isinstance(error, sa.DBAPIError) and error.connection_invalidated:
        return True
    if isinstance(error, _OUTAGE_TYPES):
        return True
    state = getattr(error, "sqlstate", None)
    return isinstance(state, str) and state.startswith(_OUTAGE_SQLSTATES)
