"""Pages of a history table (preemptions, starvations), newest first: ordered by
`(started_at, id)` (its index), a page after another starts below the last record it held."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Query
from sqlalchemy import ColumnElement, Row, Select, Table, select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.errors import InvalidInput

Limit = Annotated[int, Query(ge=1, le=500, description="records per page")]
Before = Annotated[
    int | None,
    Query(ge=1, le=2**63 - 1, description="the records older than this one (a page's last id)"),
]


async def newest_first(
    conn: AsyncConnection,
    table: Table,
    where: list[ColumnElement[bool]],
    limit: int,
    before: int | None,
) -> list[Row[Any]]:
    """The `limit` newest records matching `where`, below record `before` if given (one that
    `where` does not match, another tenant's included, is a 422 naming `before`)."""
    query: Select[Any] = select(table).where(*where)
    if before is not None:
        mark = select(table.c.started_at, table.c.id).where(table.c.id == before, *where)
        found = (await conn.execute(mark)).one_or_none()
        if found is None:
            raise InvalidInput.on("before", f"no record {before} among those listed here")
        query = query.where(tuple_(table.c.started_at, table.c.id) < tuple_(*found))
    order = (table.c.started_at.desc(), table.c.id.desc())
    return list((await conn.execute(query.order_by(*order).limit(limit))).all())


def matching(*conditions: ColumnElement[bool] | None) -> list[ColumnElement[bool]]:
    """The conditions given (None: that filter was not asked for)."""
    return [c for c in conditions if c is not None]
