"""Transactions that touch one claim and its node take their locks in one order (the claim's
row, then the node's, then its cards'), so a resize, a delete or a move never deadlocks with
a removal of the node or card, or with a high-priority claim that evicts the same claim.

Each test holds the claim's lock as the first step of a resize does, lets the other
transaction run until it waits, then finishes the resize: in the wrong order the two wait
on each other and Postgres aborts one of them (deadlock detected)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from qshare.contracts.claims import ClaimResize, ClaimSpec, CreateClaim, ResizeClaim
from qshare.contracts.domain import Priority
from qshare.contracts.schema import claims
from qshare_allocator.claims.resize import Resizer
from qshare_allocator.claims.service import ClaimService
from qshare_allocator.inventory.service import InventoryService

from .conftest import RULES, StartAgent, eventually, ready_claim

SOURCE = "test-lock-order"


async def _pid(conn: AsyncConnection) -> int:
    pid: int = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
    return pid


async def _evict_at(engine: AsyncEngine, claim_id: uuid.UUID) -> Any:
    async with engine.connect() as conn:
        query = select(claims.c.evict_at).where(claims.c.id == claim_id)
        return (await conn.execute(query)).scalar_one()


async def _waiting(engine: AsyncEngine, pid: int) -> None:
    """Until backend `pid` waits for a lock."""
    query = text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid")

    async def waits() -> bool:
        async with engine.connect() as conn:
            return bool((await conn.execute(query, {"pid": pid})).scalar() == "Lock")

    await eventually(waits, 10)


async def _race(
    engine: AsyncEngine,
    claim_id: uuid.UUID,
    other: Callable[[AsyncConnection], Awaitable[Any]],
    vmemory: int = 1024,
) -> Any:
    """Lock the claim, run `other` until it waits, resize the claim (to `vmemory` MiB),
    commit both; returns what `other` returned."""
    resize = ResizeClaim(claim_id=claim_id, change=ClaimResize(vmemory=vmemory))
    async with engine.connect() as first, engine.connect() as second:
        pid = await _pid(second)
        await second.commit()
        async with first.begin():
            await first.execute(
                select(claims.c.id).where(claims.c.id == claim_id).with_for_update()
            )

            async def run_other() -> Any:
                async with second.begin():
                    return await other(second)

            running = asyncio.create_task(run_other())
            await _waiting(engine, pid)
            await Resizer(RULES, SOURCE).resize(first, resize)
        return await running


async def test_a_resize_and_a_removal_of_the_claims_card_do_not_deadlock(
    api: httpx.AsyncClient, start_agent: StartAgent, engine: AsyncEngine
) -> None:
    agent = await start_agent(cards=1)
    claim = await ready_claim(api, vmemory="2Gi")
    card = claim["vgpus"][0]["gpu"]
    inventory = InventoryService(RULES, SOURCE)
    reply = await _race(
        engine, uuid.UUID(claim["id"]), lambda conn: inventory.remove_card(conn, agent.name, card)
    )
    assert [str(c) for c in reply.failed_claims] == [claim["id"]]


async def test_a_resize_and_a_removal_of_the_claims_node_do_not_deadlock(
    api: httpx.AsyncClient, start_agent: StartAgent, engine: AsyncEngine
) -> None:
    agent = await start_agent(cards=1)
    claim = await ready_claim(api, vmemory="2Gi")
    inventory = InventoryService(RULES, SOURCE)
    reply = await _race(
        engine, uuid.UUID(claim["id"]), lambda conn: inventory.remove_node(conn, agent.name)
    )
    assert [str(c) for c in reply.failed_claims] == [claim["id"]]


async def test_a_resize_and_a_high_priority_claim_that_would_evict_it_do_not_deadlock(
    api: httpx.AsyncClient, start_agent: StartAgent, engine: AsyncEngine
) -> None:
    """One card's memory is the victim's; the other card holds as many vGPUs as it may, so
    the new claim locks the node, finds no card, and plans to evict the victim. The resize
    shrinks the victim before the create can lock it: the plan is stale, and the create
    places the claim in the room the shrink made, evicting nobody."""
    await start_agent(cards=2, memory="16Gi")
    victim = await ready_claim(api, vmemory="14Gi")
    for _ in range(4):  # 1 % each: they spread onto the other card, up to its 4 vGPUs
        await ready_claim(api, vcore=1, vmemory="1Gi")
    cards = (await api.get("/v1/gpus")).json()
    assert sorted(c["vgpus"] for c in cards) == [1, 4]
    spec = ClaimSpec(priority=Priority.HIGH, vcore=20, vmemory=8192)
    service = ClaimService(RULES, SOURCE)
    reply = await _race(
        engine,
        uuid.UUID(victim["id"]),
        lambda conn: service.create(conn, CreateClaim(tenant="admin", spec=spec)),
    )
    assert reply.claim.status.value == "placed"
    assert await _evict_at(engine, uuid.UUID(victim["id"])) is None


async def test_a_high_priority_claim_evicts_a_victim_that_a_concurrent_resize_grew(
    api: httpx.AsyncClient, start_agent: StartAgent, engine: AsyncEngine
) -> None:
    """The plan read the victim at 10 GiB; it grows to 14 GiB before the create locks it, so
    the create plans again from what was committed and still evicts it, and stays pending."""
    await start_agent(cards=2, memory="16Gi")
    victim = await ready_claim(api, vmemory="10Gi")
    for _ in range(4):
        await ready_claim(api, vcore=1, vmemory="1Gi")
    spec = ClaimSpec(priority=Priority.HIGH, vcore=20, vmemory=8192)
    service = ClaimService(RULES, SOURCE)
    reply = await _race(
        engine,
        uuid.UUID(victim["id"]),
        lambda conn: service.create(conn, CreateClaim(tenant="admin", spec=spec)),
        vmemory=14 * 1024,
    )
    assert reply.claim.status.value == "pending"
    assert "evicted" in (reply.claim.reason or "")
    assert await _evict_at(engine, uuid.UUID(victim["id"])) is not None
