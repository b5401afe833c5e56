"""Alembic environment: runs revisions over an async (asyncpg) engine."""

from __future__ import annotations

import asyncio
import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from qshare import dburl
from qshare.contracts.schema import metadata

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = metadata
MIGRATION_LOCK = 0x7173_6D67  # "qsmg": one migration at a time per database


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get(
        "QSHARE_ALLOCATOR_DATABASE_URL"
    )
    if not url:
        raise RuntimeError("set QSHARE_ALLOCATOR_DATABASE_URL or sqlalchemy.url")
    return dburl.normalised(url)


def _run(connection: Connection) -> None:
    """All revisions in one transaction, which first waits for any other migration of the
    database (allocator replicas each migrate as they start): the one waiting then finds
    the schema at head and does nothing."""
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")
        context.run_migrations()


async def _run_online() -> None:
    engine = create_async_engine(_url())
    async with engine.connect() as connection:
        await connection.run_sync(_run)
    await engine.dispose()


if context.is_offline_mode():
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_run_online())
