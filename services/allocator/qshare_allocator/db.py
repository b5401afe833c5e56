"""Engine construction, the transaction runner that commits at the edge, with retries, and
`fetch`: the hot path's statements run straight on asyncpg."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ClauseElement, Connection, Select, literal, select
from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.dml import UpdateBase

from qshare.db import MAX_ATTEMPTS, RETRYABLE_SQLSTATES, in_transaction, sqlstate

__all__ = [
    "MAX_ATTEMPTS",
    "RETRYABLE_SQLSTATES",
    "fetch",
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
def together(*statements: UpdateBase, result: Select[Any] | None = None) -> Select[Any]:
    """One statement running several writes as data-modifying CTEs: one round trip. Its rows
    are `result`'s (by default one row, the number of writes).

    Built once per combination of (themselves cached) statements.
    """
    ctes = [statement.cte(f"write_{i}") for i, statement in enumerate(statements)]
    return (select(literal(len(ctes))) if result is None else result).add_cte(*ctes)


@dataclass(frozen=True)
class _Compiled:
    """A statement compiled once for asyncpg: its SQL, and its parameters' names in `$n`
    order with the conversion SQLAlchemy would apply to each (JSON to text, ...)."""

    sql: str
    compiled: SQLCompiler
    names: tuple[str, ...]
    convert: tuple[Callable[[Any], Any] | None, ...]


@functools.cache
def _compiled(statement: ClauseElement) -> _Compiled:
    compiled = statement.compile(dialect=PGDialect_asyncpg())  # type: ignore[no-untyped-call]
    assert isinstance(compiled, SQLCompiler) and not compiled.post_compile_params
    names = tuple(compiled.positiontup or ())
    processors: Mapping[str, Any] = compiled._bind_processors  # one callable (or none) each
    return _Compiled(compiled.string, compiled, names, tuple(processors.get(n) for n in names))


async def fetch(conn: AsyncConnection, statement: ClauseElement, params: Mapping[str, Any]) -> Any:
    """The rows (asyncpg records: `row["name"]`) of `statement`, a statement built once, run
    in `conn`'s transaction straight on asyncpg: SQLAlchemy's layers per execution (result,
    cursor and greenlet) cost several times asyncpg's own CPU, and a placement runs a few
    statements. A failure is raised as `conn.execute` raises it (a DBAPIError carrying the
    SQLSTATE, the connection invalidated when it is gone), so retries still see it. It reads
    private parts of SQLAlchemy 2.1's asyncpg adapter and compiler (its mutex, transaction
    start, bind processors, error translation): pyproject.toml keeps SQLAlchemy to 2.1.x, and
    every control-plane test runs through it."""
    compiled = _compiled(statement)
    values = compiled.compiled.construct_params(dict(params))
    args = [
        values[name] if convert is None else convert(values[name])
        for name, convert in zip(compiled.names, compiled.convert, strict=True)
    ]
    adapted: Any = conn.sync_connection.connection.dbapi_connection  # type: ignore[union-attr]
    async with adapted._execute_mutex:  # as SQLAlchemy's asyncpg cursor runs a statement
        if adapted._transaction is None:
            await adapted._start_transaction()
        try:
            return await adapted._connection.fetch(compiled.sql, *args)
        except Exception as error:
            failure = error
    await conn.run_sync(_raise_as_sqlalchemy, adapted, failure, compiled.sql, args)
    raise AssertionError("unreachable")


def _raise_as_sqlalchemy(
    sync: Connection, adapted: Any, error: Exception, sql: str, args: list[Any]
) -> None:
    """Translate an asyncpg error as the dialect does, then raise it as the connection does."""
    try:
        adapted._handle_exception(error)
    except Exception as translated:
        sync._handle_dbapi_exception(translated, sql, tuple(args), None, None)
