"""Emptying the inventory between tests while the services under test keep running."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from qshare.db import in_transaction


async def empty_tables(engine: AsyncEngine, tables: Sequence[str]) -> None:
    """TRUNCATE `tables` (CASCADE) in one transaction that does not lose a deadlock: its own
    deadlock check waits longer than the services' (1 s), so when a running sweep deadlocks
    with it, Postgres aborts the sweep (the services retry deadlocks), not the test's set-up.
    Setting deadlock_timeout needs a superuser, as the tests' embedded Postgres has."""

    async def truncate(conn: AsyncConnection) -> None:
        await conn.execute(text("SET LOCAL deadlock_timeout = '30s'"))
        await conn.execute(text(f"TRUNCATE {', '.join(tables)} CASCADE"))

    await in_transaction(engine, truncate)
