"""Every allocator replica migrates the schema before it serves (the Kubernetes Deployment's
init container): replicas starting together on an empty database must not race."""

from __future__ import annotations

import asyncio
import os
import sys

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from qshare.testing.servers import EmbeddedPostgres

MIGRATION_LOCK = 0x7173_6D67
"""migrations/env.py's advisory lock key (env.py is not importable: Alembic runs it)."""


async def migrate(url: str) -> tuple[int, bytes]:
    """`python -m qshare_allocator migrate`, as the init container runs it."""
    env = os.environ | {"QSHARE_ALLOCATOR_DATABASE_URL": url}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "qshare_allocator", "migrate", env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await process.communicate()
    return process.returncode or 0, err


async def test_replicas_migrating_an_empty_database_together_all_succeed() -> None:
    async with EmbeddedPostgres(durable=False) as server:
        results = await asyncio.gather(*(migrate(server.url) for _ in range(3)))
        engine = create_async_engine(server.url)
        async with engine.connect() as conn:
            versions = (await conn.execute(text("SELECT version_num FROM alembic_version"))).all()
        await engine.dispose()
    assert [code for code, _ in results] == [0, 0, 0], [err[-300:] for _, err in results]
    assert len(versions) == 1


async def test_a_migration_waits_for_the_lock_before_touching_the_schema() -> None:
    """The lock is taken before the first statement of the upgrade (alembic_version is not
    even created while another migration holds it), and the upgrade goes on once it is freed,
    as it is when the holder's session ends (a migration killed midway)."""
    async with EmbeddedPostgres(durable=False) as server:
        engine = create_async_engine(server.url)
        try:
            async with engine.connect() as holder:
                await holder.execute(text(f"SELECT pg_advisory_lock({MIGRATION_LOCK})"))
                waiting = asyncio.create_task(migrate(server.url))
                await asyncio.sleep(3.0)
                assert not waiting.done()
                found = await holder.scalar(text("SELECT to_regclass('alembic_version')"))
                assert found is None
            await engine.dispose()  # ends the holder's session, and with it its lock
            code, err = await asyncio.wait_for(waiting, 60)
            assert code == 0, err[-300:]
        finally:
            await engine.dispose()
