"""Reading claims and their vGPUs from Postgres, with keyset pagination."""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Select, select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.claims import ClaimView
from qshare.contracts.domain import ClaimStatus, Priority
from qshare.contracts.errors import InvalidInput
from qshare.contracts.rows import claim_views
from qshare.contracts.schema import claims

MIN_TIME = datetime(1970, 1, 1, tzinfo=UTC)
MAX_TIME = datetime(9000, 1, 1, tzinfo=UTC)


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
    if cursor is not None:
        query = query.where(
            tuple_(claims.c.created_at, claims.c.id) > tuple_(*decode_cursor(cursor))
        )
    rows = (
        await conn.execute(query.order_by(claims.c.created_at, claims.c.id).limit(limit + 1))
    ).all()
    page = rows[:limit]
    following = encode_cursor(page[-1].created_at, page[-1].id) if len(rows) > limit else None
    return await claim_views(conn, page), following


def encode_cursor(created_at: datetime, claim_id: uuid.UUID) -> str:
    return base64.urlsafe_b64encode(f"{created_at.isoformat()}|{claim_id}".encode()).decode()


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    """The position a cursor names; anything this API did not write is refused, including a
    time without a zone or one Postgres cannot hold once converted to UTC."""
    try:
        created, _, claim_id = base64.urlsafe_b64decode(cursor.encode()).decode().partition("|")
        when = datetime.fromisoformat(created)
        if when.tzinfo is None or not MIN_TIME <= when.astimezone(UTC) <= MAX_TIME:
            raise ValueError(created)
        return when, uuid.UUID(claim_id)
    except (ValueError, OverflowError) as exc:
        raise InvalidInput.on("cursor", "not a cursor returned by this API") from exc


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
