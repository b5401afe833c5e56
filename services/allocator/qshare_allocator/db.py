"""Engine construction and the transaction runner that commits at the edge, with retries."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import Select, literal, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.sql.dml import UpdateBase

from qshare.db import MAX_ATTEMPTS, RETRYABLE_SQLSTATES, in_transaction, sqlstate

__all__ = [
    "MAX_ATTEMPTS",
    "RETRYABLE_SQLSTATES",
    "in_transaction",
    "make_engine",
    "sqlstate",
    "together",
]


def make_engine(url: str, pool_size: int) -> AsyncEngine:
    """The pool hands out the connection returned last (LIFO): a few busy connections, each
    with its statements already prepared, instead of every connection in turn preparing
    each statement again."""
    return create_async_engine(
        url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=False, pool_use_lifo=True
    )


@functools.cache
def together(*statements: UpdateBase) -> Select[Any]:
    """One statement running several writes as data-modifying CTEs: one round trip.

    Built once per combination of (themselves cached) statements.
    """
    ctes = [statement.cte(f"write_{i}") for i, statement in enumerate(statements)]
    return select(literal(len(ctes))).add_cte(*ctes)
