"""The Alembic migrations build exactly the schema the services query (`contracts/schema.py`):
a table, column or index added to one and not the other fails here, not in production."""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from qshare.contracts.schema import metadata


def _differences(conn: Connection) -> list[Any]:
    return list(compare_metadata(MigrationContext.configure(conn), metadata))


async def test_the_migrated_database_matches_the_schema_the_services_use(database_url: str) -> None:
    engine = create_async_engine(database_url)
    try:
        async with engine.connect() as conn:
            assert await conn.run_sync(_differences) == []
    finally:
        await engine.dispose()
