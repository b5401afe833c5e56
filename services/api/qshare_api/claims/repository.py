"""Reading claims and their vGPUs from Postgres, with keyset pagination."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.claims import ClaimView
from qshare.contracts.domain import ClaimStatus, Priority
from qshare.contracts.rows import claim_views
from qshare.contracts.schema import claims
from qshare_api.pages import TIME_AND_ID, decode, encode


@dataclass(frozen=True)
class ClaimFilter:
    tenant: str | None = None
    status: ClaimStatus | None = None
    priority: Priority | None = None
    node: str | None = None


async def get_claim(
    conn: AsyncConnection, claim_id: uuid.UUID, tenant: str | None
) -> ClaimView | None:
    """The claim, or None when it does not exist, was deleted (released) or belongs to
    another tenant. Released claims stay listed under `?status=released`."""
    query = select(claims).where(
        claims.c.id == claim_id, claims.c.status != ClaimStatus.RELEASED.value
    )
    if tenant is not None:
        query = query.where(claims.c.tenant == tenant)
    row = (await conn.execute(query)).one_or_none()
    return None if row is None else (await claim_views(conn, [row]))[0]


async def list_claims(
    conn: AsyncConnection, where: ClaimFilter, limit: int, cursor: str | None
) -> tuple[list[ClaimView], str | None]:
    """A page of claims, oldest first, and the cursor of the next page (None at the end)."""
    query = _filtered(select(claims), where)
    if (after := decode(cursor, TIME_AND_ID)) is not None:
        query = query.where(tuple_(claims.c.created_at, claims.c.id) > tuple_(*after))
    rows = (
        await conn.execute(query.order_by(claims.c.created_at, claims.c.id).limit(limit + 1))
    ).all()
    page = rows[:limit]
    following = encode(page[-1].created_at, page[-1].id) if len(rows) > limit else None
    return await claim_views(conn, page), following


def _filtered(query: Select[Any], where: ClaimFilter) -> Select[Any]:
    conditions = {
        claims.c.tenant: where.tenant,
        claims.c.status: where.status.value if where.status else None,
        claims.c.priority: where.priority.value if where.priority else None,
        claims.c.node_name: where.node,
    }
    for column, value in conditions.items():
        if value is not None:
            query = query.where(column == value)
    return query
