"""A pending claim that the cluster's rules of now refuse (stored when they allowed it, say
before the minimum slice grew) waits with a reason saying so, and the pending sweep goes
on to the claims after it instead of failing at it on every pass."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.controlplane.conftest import Claim, Register, claim_status, eventually


async def _shrink_below_the_minimum(engine: AsyncEngine, claim_id: object) -> None:
    """What a claim created under a smaller `min_vgpu_mib` looks like in Postgres."""
    async with engine.begin() as conn:
        query = text("UPDATE claims SET vmemory_mib = 512 WHERE id = :id")
        await conn.execute(query, {"id": claim_id})


async def _placed(engine: AsyncEngine, claim_id: object) -> bool:
    return await claim_status(engine, claim_id) == "placed"  # type: ignore[arg-type]


async def _reason(engine: AsyncEngine, claim_id: object) -> str:
    async with engine.connect() as conn:
        query = text("SELECT reason FROM claims WHERE id = :id")
        return str((await conn.execute(query, {"id": claim_id})).scalar_one())


async def test_a_pending_claim_the_rules_now_refuse_does_not_stop_the_sweep(
    engine: AsyncEngine, register: Register, claim: Claim
) -> None:
    refused = await claim("team-a", priority="high")
    await _shrink_below_the_minimum(engine, refused.id)
    after = await claim("team-a", priority="low")
    await register("late-node", cards=1)
    await eventually(lambda: _placed(engine, after.id), within_s=10)
    assert await claim_status(engine, refused.id) == "pending"
    assert "at least 1 GiB" in await _reason(engine, refused.id)
