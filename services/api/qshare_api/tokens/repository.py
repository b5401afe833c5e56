"""Storing tokens by hash; the secret itself is shown once, when issued."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, or_, select, tuple_
from sqlalchemy.dialects.postgresql import insert as upsert
from sqlalchemy.ext.asyncio import AsyncConnection

from qshare.contracts.domain import Role, TokenScope
from qshare.contracts.errors import Conflict
from qshare.contracts.schema import bootstraps, tokens
from qshare_api.auth import hash_token


async def store_token(
    conn: AsyncConnection,
    name: str,
    tenant: str,
    role: Role,
    secret: str,
    scope: TokenScope = TokenScope.WRITE,
    expires_at: datetime | None = None,
) -> tuple[uuid.UUID, datetime]:
    """Store a token's hash; its id and the time the database recorded it."""
    token_id = uuid.uuid4()
    row = _row(token_id, name, tenant, role, secret) | {
        "scope": scope.value,
        "expires_at": expires_at,
    }
    stored = await conn.execute(insert(tokens).values(row).returning(tokens.c.created_at))
    return token_id, stored.scalar_one()


async def ensure_token(
    conn: AsyncConnection, name: str, tenant: str, role: Role, secret: str
) -> bool:
    """Store a bootstrap token the first time only, and record that it was; True if stored.

    Every later start finds the record and stores nothing, so a bootstrap token revoked
    since never comes back, whatever the variable still says."""
    record = upsert(bootstraps).values(name=name, token_hash=hash_token(secret))
    first = await conn.execute(
        record.on_conflict_do_nothing(index_elements=[bootstraps.c.name]).returning(
            bootstraps.c.name
        )
    )
    if first.scalar_one_or_none() is None:
        return False
    statement = upsert(tokens).values(_row(uuid.uuid4(), name, tenant, role, secret))
    await conn.execute(statement.on_conflict_do_nothing(index_elements=[tokens.c.token_hash]))
    return True


async def list_tokens(
    conn: AsyncConnection,
    after: tuple[datetime, uuid.UUID] | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Tokens oldest first (then by id), after the one at `after` when given."""
    query = select(
        tokens.c.id, tokens.c.name, tokens.c.tenant, tokens.c.role, tokens.c.scope,
        tokens.c.created_at, tokens.c.expires_at,
    )  # fmt: skip
    if after is not None:
        query = query.where(tuple_(tokens.c.created_at, tokens.c.id) > tuple_(*after))
    query = query.order_by(tokens.c.created_at, tokens.c.id).limit(limit)
    return [dict(r._mapping) for r in (await conn.execute(query)).all()]


async def revoke_token(conn: AsyncConnection, token_id: uuid.UUID) -> bool:
    """Revoke a token; the last unexpired admin token that can write is refused (409): with
    it gone no one could issue tokens again, the bootstrap token never coming back. The
    writers are locked first, so two admins revoking each other's token at once cannot both
    pass."""
    writers = select(tokens.c.id).where(
        tokens.c.role == Role.ADMIN.value,
        tokens.c.scope == TokenScope.WRITE.value,
        or_(tokens.c.expires_at.is_(None), tokens.c.expires_at > func.now()),
    )
    held = set((await conn.execute(writers.with_for_update())).scalars().all())
    if held == {token_id}:
        raise Conflict(
            f"token {token_id} is the last admin token that can write: issue another "
            "(qshare tokens create --role admin) before revoking it"
        )
    result = await conn.execute(
        delete(tokens).where(tokens.c.id == token_id).returning(tokens.c.id)
    )
    return result.scalar_one_or_none() is not None


def _row(token_id: uuid.UUID, name: str, tenant: str, role: Role, secret: str) -> dict[str, object]:
    return {
        "id": token_id,
        "name": name,
        "tenant": tenant,
        "role": role.value,
        "token_hash": hash_token(secret),
    }
