"""Memory preemption: a high-priority claim that finds the memory held by low priority
evicts the fewest, youngest low-priority claims after their grace period, and they are
placed again or wait with the reason."""

from __future__ import annotations

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from .conftest import StartAgent, claim_until, create_claim


async def short_grace(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE classes SET eviction_grace_s = 0.5 WHERE name = 'qshare'"))


async def test_high_priority_evicts_the_youngest_low_priority_claim_and_becomes_ready(
    api: httpx.AsyncClient, start_agent: StartAgent, engine: AsyncEngine
) -> None:
    await short_grace(engine)
    await start_agent(cards=1, memory="8Gi")
    older = await create_claim(api, vmemory="4Gi")
    younger = await create_claim(api, vmemory="4Gi")
    await claim_until(api, younger["id"], "ready")
    high = await create_claim(api, priority="high", vcore=50, vmemory="4Gi")
    assert high["status"] == "pending" and "evicted" in high["reason"]
    await claim_until(api, high["id"], "ready")
    evicted = await claim_until(api, younger["id"], "pending")
    assert "evicted" in evicted["reason"]
    assert (await api.get(f"/v1/claims/{older['id']}")).json()["status"] == "ready"


async def test_an_eviction_is_recorded_as_a_preemption(
    api: httpx.AsyncClient, start_agent: StartAgent, engine: AsyncEngine
) -> None:
    await short_grace(engine)
    await start_agent(cards=1, memory="4Gi")
    low = await create_claim(api, vmemory="4Gi")
    high = await create_claim(api, priority="high", vcore=50, vmemory="4Gi")
    await claim_until(api, high["id"], "ready")
    records = (await api.get("/v1/preemptions", params={"claim": low["id"]})).json()
    assert [r["kind"] for r in records] == ["eviction"]


async def test_high_priority_never_evicts_high_priority(
    api: httpx.AsyncClient, start_agent: StartAgent, engine: AsyncEngine
) -> None:
    await short_grace(engine)
    await start_agent(cards=1, memory="4Gi")
    await create_claim(api, priority="high", vcore=20, vmemory="4Gi")
    second = await create_claim(api, priority="high", vcore=20, vmemory="4Gi")
    assert second["status"] == "pending"
    assert "evicted" not in second["reason"]
