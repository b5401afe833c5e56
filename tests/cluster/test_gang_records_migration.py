"""Migration 0007 (`preemptions.busy_gpus`): an open gang record takes the one card it named,
other records none, and the downgrade drops the column again (on a database of its own)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest
from alembic import command
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import create_async_engine

from qshare_allocator.migrate import alembic_config, upgrade

RECORDS = [
    ("00000000-0000-0000-0000-000000000001", "gang", "GPU-a", None),
    ("00000000-0000-0000-0000-000000000002", "gang", "GPU-b", "now()"),
    ("00000000-0000-0000-0000-000000000003", "operator", None, None),
]


@pytest.fixture
async def scratch_url(database_url: str) -> AsyncIterator[str]:
    """A fresh, empty database on the session's server; dropped after the test."""
    name = f"qshare_migration_{os.getpid()}"
    admin = create_async_engine(database_url, isolation_level="AUTOCOMMIT")
    async with admin.connect() as conn:
        await conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
        await conn.execute(text(f"CREATE DATABASE {name}"))
    yield make_url(database_url).set(database=name).render_as_string(hide_password=False)
    async with admin.connect() as conn:
        await conn.execute(text(f"DROP DATABASE {name} WITH (FORCE)"))
    await admin.dispose()


async def test_open_gang_records_name_their_card_as_busy_and_the_downgrade_drops_the_column(
    scratch_url: str,
) -> None:
    await upgrade(scratch_url, "0006")
    engine = create_async_engine(scratch_url)
    async with engine.begin() as conn:
        for claim, kind, gpu, ended in RECORDS:
            await conn.execute(
                text("INSERT INTO preemptions (claim_id, tenant, gpu_uuid, kind, reason, ended_at) "
                     f"VALUES (:c, 't', :g, :k, 'r', {ended or 'NULL'})"),
                {"c": claim, "g": gpu, "k": kind},
            )  # fmt: skip
    await upgrade(scratch_url, "0007")
    query = text("SELECT busy_gpus FROM preemptions ORDER BY claim_id")
    async with engine.connect() as conn:
        assert (await conn.execute(query)).scalars().all() == [["GPU-a"], None, None]
    await asyncio.to_thread(command.downgrade, alembic_config(scratch_url), "0006")
    columns = text(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'preemptions'"
    )
    async with engine.connect() as conn:
        assert "busy_gpus" not in (await conn.execute(columns)).scalars().all()
    await engine.dispose()
