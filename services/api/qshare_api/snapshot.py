"""Reads of several statements that see one state of the database: a claim and its vGPUs as
one commit left them, never a claim `ready` beside the vGPUs a move has already taken away."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine


@asynccontextmanager
async def snapshot(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection whose statements share one snapshot: a REPEATABLE READ transaction, which
    a read alone never sees fail with a serialization error."""
    async with engine.connect() as conn:
        repeatable = await conn.execution_options(isolation_level="REPEATABLE READ")
        async with repeatable.begin():
            yield repeatable
