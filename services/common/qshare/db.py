"""Running work in one Postgres transaction that commits at the edge, with retries of the
failures that running it again resolves; shared by the services that write Postgres. Reads:
one statement on its own (`read_once`), or several in one snapshot (`snapshot`)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

T = TypeVar("T")
log = logging.getLogger(__name__)

RETRYABLE_SQLSTATES = frozenset({"40001", "40P01", "23505"})
"""Serialization failure, deadlock, and a unique violation from a racing twin request
(same idempotency key, same node name): running the transaction again resolves each."""
MAX_ATTEMPTS = 5


async def in_transaction(engine: AsyncEngine, work: Callable[[AsyncConnection], Awaitable[T]]) -> T:
    """Run `work` in one transaction, committed when it returns and rolled back when it raises.

    Services only execute statements; this is the one place that commits.
    """
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            async with engine.begin() as conn:
                return await work(conn)
        except DBAPIError as exc:
            if attempt == MAX_ATTEMPTS or sqlstate(exc) not in RETRYABLE_SQLSTATES:
                raise
            log.info("retrying transaction after %s (attempt %d)", sqlstate(exc), attempt)
    raise AssertionError("unreachable")


async def read_once(engine: AsyncEngine, work: Callable[[AsyncConnection], Awaitable[T]]) -> T:
    """Run `work`, one read-only statement, outside a transaction: no BEGIN and COMMIT round
    trips on a hot path where a single statement's own snapshot is all that is needed."""
    async with engine.connect() as conn:
        autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
        return await work(autocommit)


@asynccontextmanager
async def snapshot(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection whose statements share one snapshot (a REPEATABLE READ transaction, which
    a read alone never sees fail with a serialization error): a claim and its vGPUs as one
    commit left them, never a claim `ready` beside the vGPUs a move has already taken away."""
    async with engine.connect() as conn:
        repeatable = await conn.execution_options(isolation_level="REPEATABLE READ")
        async with repeatable.begin():
            yield repeatable


def sqlstate(exc: DBAPIError) -> str | None:
    orig = exc.orig
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return str(code) if code is not None else None
