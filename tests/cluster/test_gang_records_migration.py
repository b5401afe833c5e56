"""Migration 0007 (`preemptions.busy_gpus`): an open gang record takes the one card it named,
other records none, and the downgrade drops the column again (on a database of its own)."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from qshare_allocator.migrate import upgrade

from .conftest import preemption_columns_after_downgrade

RECORDS = [
    ("00000000-0000-0000-0000-000000000001", "gang", "GPU-a", None),
    ("00000000-0000-0000-0000-000000000002", "gang", "GPU-b", "now()"),
    ("00000000-0000-0000-0000-000000000003", "operator", None, None),
]


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
    await engine.dispose()
    assert "busy_gpus" not in await preemption_columns_after_downgrade(scratch_url, "0006")
