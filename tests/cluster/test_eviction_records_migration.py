"""Migration 0009 (`preemptions.for_claim`): an open eviction record takes the claim its
reason names, other records none, and the downgrade drops the column (on a database of its
own)."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from qshare_allocator.migrate import upgrade

from .conftest import preemption_columns_after_downgrade

FOR = "0000000a-0000-0000-0000-00000000000a"
RECORDS = [
    ("00000000-0000-0000-0000-000000000001", "eviction", f"evicted for high-priority claim {FOR}",
     None),
    ("00000000-0000-0000-0000-000000000002", "eviction", f"evicted for high-priority claim {FOR}",
     "now()"),
    ("00000000-0000-0000-0000-000000000003", "operator", "held by an operator", None),
]  # fmt: skip


async def test_open_eviction_records_name_the_claim_they_make_room_for(scratch_url: str) -> None:
    await upgrade(scratch_url, "0008")
    engine = create_async_engine(scratch_url)
    async with engine.begin() as conn:
        for claim, kind, reason, ended in RECORDS:
            await conn.execute(
                text("INSERT INTO preemptions (claim_id, tenant, kind, reason, ended_at) "
                     f"VALUES (:c, 't', :k, :r, {ended or 'NULL'})"),
                {"c": claim, "k": kind, "r": reason},
            )  # fmt: skip
    await upgrade(scratch_url, "0009")
    query = text("SELECT for_claim::text FROM preemptions ORDER BY claim_id")
    async with engine.connect() as conn:
        assert (await conn.execute(query)).scalars().all() == [FOR, None, None]
    await engine.dispose()
    assert "for_claim" not in await preemption_columns_after_downgrade(scratch_url, "0008")
