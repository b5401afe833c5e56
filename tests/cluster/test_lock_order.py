"""Transactions that touch one claim and its node take their locks in one order (the claim's
row, then the node's, then its cards'), so a resize, a delete or a move never deadlocks with
a removal of the node or card, or with a high-priority claim that evicts the same claim.

Each test holds the claim's lock as the first step of a resize does, lets the other
transaction run until it waits, then finishes the resize: in the wrong order the two wait
on each other and Postgres aborts one of them (deadlock detected). Two moves, which each
hold several nodes, take them in name order."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from qshare.contracts.claims import (
    ClaimResize,
    ClaimSpec,
    CreateClaim,
    CreateClaimReply,
    ResizeClaim,
)
from qshare.contracts.domain import Priority
from qshare.contracts.schema import claims, gpus
from qshare.contracts.usage import MoveClaim, MoveReply
from qshare_allocator.claims.resize import Resizer
from qshare_allocator.claims.service import ClaimService
from qshare_allocator.inventory.service import InventoryService
from qshare_allocator.placement.moving import Mover

from .conftest import RULES, StartAgent, claim_until, eventually, ready_claim

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
) -> Any:
    """Lock the claim, run `other` until it waits, resize the claim (a shrink), commit both;
    returns what `other` returned."""
    resize = ResizeClaim(claim_id=claim_id, change=ClaimResize(vmemory=1024))
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


async def _two_cards_one_victim(
    api: httpx.AsyncClient, start_agent: StartAgent, victim_memory: str
) -> dict[str, Any]:
    """One card's memory is mostly the victim's; the other card holds as many vGPUs as it
    may, so an 8 GiB high-priority claim locks the node, finds no card, and plans to evict
    the victim."""
    await start_agent(cards=2, memory="16Gi")
    victim = await ready_claim(api, vmemory=victim_memory)
    for _ in range(4):  # 1 % each: they spread onto the other card, up to its 4 vGPUs
        await ready_claim(api, vcore=1, vmemory="1Gi")
    return victim


async def _create_while_resizing(
    engine: AsyncEngine, claim_id: uuid.UUID, vmemory: int
) -> CreateClaimReply:
    """Hold the claim's lock as a resize does, create an 8 GiB high-priority claim to its end
    (it must not wait for the claim: it may hold the node, which the resize takes next),
    then finish the resize."""
    spec = ClaimSpec(priority=Priority.HIGH, vcore=20, vmemory=8192)
    resize = ResizeClaim(claim_id=claim_id, change=ClaimResize(vmemory=vmemory))
    async with engine.connect() as first, engine.connect() as second, first.begin():
        await first.execute(select(claims.c.id).where(claims.c.id == claim_id).with_for_update())

        async def create() -> CreateClaimReply:
            async with second.begin():
                service = ClaimService(RULES, SOURCE)
                return await service.create(second, CreateClaim(tenant="admin", spec=spec))

        reply = await asyncio.wait_for(create(), 10)
        await Resizer(RULES, SOURCE).resize(first, resize)
    return reply


async def test_a_high_priority_claim_does_not_wait_for_a_victim_a_resize_holds(
    api: httpx.AsyncClient, start_agent: StartAgent, engine: AsyncEngine
) -> None:
    """It waits pending instead, evicting nobody yet."""
    victim = await _two_cards_one_victim(api, start_agent, "14Gi")
    reply = await _create_while_resizing(engine, uuid.UUID(victim["id"]), 14 * 1024)
    assert reply.claim.status.value == "pending"
    assert "evicted" not in (reply.claim.reason or "")


async def test_a_shrink_that_makes_room_places_the_waiting_claim_evicting_nobody(
    api: httpx.AsyncClient, start_agent: StartAgent, engine: AsyncEngine
) -> None:
    victim = await _two_cards_one_victim(api, start_agent, "14Gi")
    reply = await _create_while_resizing(engine, uuid.UUID(victim["id"]), 1024)
    await claim_until(api, str(reply.claim.id), "ready")
    assert await _evict_at(engine, uuid.UUID(victim["id"])) is None


async def test_a_growth_that_leaves_no_room_has_the_waiting_claim_evict_the_victim(
    api: httpx.AsyncClient, start_agent: StartAgent, engine: AsyncEngine
) -> None:
    """The plan read the victim at 10 GiB; it grows to 14 GiB meanwhile: the pending sweep
    plans again from what was committed and evicts it."""
    victim = await _two_cards_one_victim(api, start_agent, "10Gi")
    reply = await _create_while_resizing(engine, uuid.UUID(victim["id"]), 14 * 1024)

    async def evicting() -> bool:
        return await _evict_at(engine, uuid.UUID(victim["id"])) is not None

    await eventually(evicting, 10)
    waiting = (await api.get(f"/v1/claims/{reply.claim.id}")).json()
    assert "evicted" in waiting["reason"]


async def _movable_class(api: httpx.AsyncClient) -> str:
    name = f"movable-{uuid.uuid4().hex[:8]}"
    body = {"name": name, "provisioner": "qshare", "move_on_starvation": True}
    response = await api.post("/v1/classes", json=body)
    assert response.status_code == 201, response.text
    return name


async def _cards(engine: AsyncEngine, node: str) -> list[str]:
    async with engine.connect() as conn:
        query = select(gpus.c.uuid).where(gpus.c.node_name == node).order_by(gpus.c.idx)
        return list((await conn.execute(query)).scalars().all())


async def _move(conn: AsyncConnection, command: MoveClaim) -> MoveReply:
    async with conn.begin():
        return await Mover(RULES, SOURCE).move(conn, command)


async def _two_moves(
    engine: AsyncEngine, full_card: str, first: MoveClaim, second: MoveClaim
) -> list[MoveReply | BaseException]:
    """Fill `full_card` in a transaction left open until both moves wait, so the first move
    (which tries that card first) waits for it, then tries its next target; the second
    move starts meanwhile. Returns each move's reply, or what it raised."""
    fill = text("UPDATE gpus SET allocated_mib = memory_mib WHERE uuid = :uuid")
    async with engine.connect() as filler, engine.connect() as one, engine.connect() as two:
        pids = [await _pid(one), await _pid(two)]
        await one.commit()
        await two.commit()
        async with filler.begin():
            await filler.execute(fill, {"uuid": full_card})
            moving = [asyncio.create_task(_move(one, first))]
            await _waiting(engine, pids[0])
            moving.append(asyncio.create_task(_move(two, second)))
            await _waiting(engine, pids[1])
        return list(await asyncio.gather(*moving, return_exceptions=True))


async def test_two_moves_through_each_others_nodes_do_not_deadlock(
    api: httpx.AsyncClient, start_agent: StartAgent, engine: AsyncEngine
) -> None:
    """The first claim (on node a) tries node c's card, then node b's; the second (on node b)
    tries node c's. Locked in preference order, the first held c and waited for b while the
    second held b and waited for c."""
    prefix, movable = f"lock-{uuid.uuid4().hex[:6]}", await _movable_class(api)
    await start_agent(cards=1, name=f"{prefix}-a")
    first = await ready_claim(api, vmemory="10Gi", class_name=movable)
    b = await start_agent(cards=2, name=f"{prefix}-b")
    second = await ready_claim(api, vmemory="8Gi", class_name=movable)
    c = await start_agent(cards=1, name=f"{prefix}-c")
    first_gpu, second_gpu = first["vgpus"][0]["gpu"], second["vgpus"][0]["gpu"]
    [free_on_b] = [g for g in await _cards(engine, b.name) if g != second_gpu]
    [on_c] = await _cards(engine, c.name)
    replies = await _two_moves(
        engine, on_c,
        MoveClaim(claim_id=first["id"], from_gpu=first_gpu, to_gpus=[on_c, free_on_b]),
        MoveClaim(claim_id=second["id"], from_gpu=second_gpu, to_gpus=[on_c]),
    )  # fmt: skip
    assert [getattr(r, "moved_to", r) for r in replies] == [free_on_b, None]
