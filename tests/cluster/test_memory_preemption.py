"""Memory preemption: a high-priority claim that finds the memory held by low priority
evicts the fewest, youngest low-priority claims after their grace period, and they are
placed again or wait with the reason."""

from __future__ import annotations

import asyncio
import uuid

import httpx
from sqlalchemy import func, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.contracts.domain import Priority
from qshare.contracts.schema import claims
from qshare_allocator.app import Allocator

from .conftest import StartAgent, claim_until, create_claim, eventually


async def short_grace(engine: AsyncEngine, seconds: float = 0.5) -> None:
    """The default class's grace period (the classes table outlives each test)."""
    query = text("UPDATE classes SET eviction_grace_s = :s WHERE name = 'qshare'")
    async with engine.begin() as conn:
        await conn.execute(query, {"s": seconds})


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


async def test_a_waiting_high_priority_claim_evicts_once_eviction_would_make_room(
    api: httpx.AsyncClient, start_agent: StartAgent, engine: AsyncEngine
) -> None:
    """At create, evicting the low-priority claim is not enough; once another high-priority
    claim leaves, it is: the waiting claim evicts on the pending sweep, not only at create."""
    await short_grace(engine)
    await start_agent(cards=1, memory="16Gi")
    first = await create_claim(api, priority="high", vcore=40, vmemory="8Gi")
    low = await create_claim(api, vmemory="8Gi")
    await claim_until(api, low["id"], "ready")
    waiting = await create_claim(api, priority="high", vcore=40, vmemory="10Gi")
    assert waiting["status"] == "pending" and "evicted" not in waiting["reason"]
    assert (await api.delete(f"/v1/claims/{first['id']}")).status_code == 200
    await claim_until(api, waiting["id"], "ready")
    evicted = await claim_until(api, low["id"], "pending")
    assert "evicted" in evicted["reason"]


async def test_a_waiting_high_priority_claim_evicts_no_more_while_its_eviction_runs(
    api: httpx.AsyncClient, start_agent: StartAgent, engine: AsyncEngine
) -> None:
    """The grace period spans many sweeps: the victims chosen at create are the only ones."""
    await short_grace(engine, 30.0)  # outlasts the test
    await start_agent(cards=1, memory="16Gi")
    lows = [await create_claim(api, vmemory="4Gi") for _ in range(4)]
    await claim_until(api, lows[-1]["id"], "ready")
    high = await create_claim(api, priority="high", vcore=40, vmemory="4Gi")
    assert "waiting for 1 low-priority claim(s)" in high["reason"]
    await asyncio.sleep(2.0)  # four sweeps at the tests' 0.5 s
    records = (await api.get("/v1/preemptions")).json()
    assert [r["kind"] for r in records] == ["eviction"]


async def test_a_high_priority_whole_card_claim_evicts_every_low_priority_claim_on_a_card(
    api: httpx.AsyncClient, start_agent: StartAgent, engine: AsyncEngine
) -> None:
    await short_grace(engine)
    await start_agent(cards=1, memory="16Gi")
    lows = [await create_claim(api, vmemory="4Gi") for _ in range(2)]
    await claim_until(api, lows[-1]["id"], "ready")
    high = await create_claim(api, priority="high", class_name="whole")
    assert "waiting for 2 low-priority claim(s)" in high["reason"]
    await claim_until(api, high["id"], "ready")
    for low in lows:
        assert "evicted" in (await claim_until(api, low["id"], "pending"))["reason"]


async def test_a_high_priority_claim_evicts_the_youngest_claim_for_a_free_vgpu_slot(
    api: httpx.AsyncClient, start_agent: StartAgent, engine: AsyncEngine
) -> None:
    """The card has memory to spare but holds as many vGPUs as it may (16 GiB: 4)."""
    await short_grace(engine)
    await start_agent(cards=1, memory="16Gi")
    lows = [await create_claim(api, vcore=10, vmemory="1Gi") for _ in range(4)]
    await claim_until(api, lows[-1]["id"], "ready")
    high = await create_claim(api, priority="high", vcore=40, vmemory="1Gi")
    assert "waiting for 1 low-priority claim(s)" in high["reason"]
    await claim_until(api, high["id"], "ready")
    assert "evicted" in (await claim_until(api, lows[-1]["id"], "pending"))["reason"]
    for low in lows[:-1]:
        assert (await api.get(f"/v1/claims/{low['id']}")).json()["status"] == "ready"


async def test_a_high_priority_claim_of_two_cards_evicts_on_both_cards_of_one_node(
    api: httpx.AsyncClient, start_agent: StartAgent, engine: AsyncEngine
) -> None:
    await short_grace(engine)
    await start_agent(cards=2, memory="8Gi")
    lows = [await create_claim(api, vmemory="8Gi") for _ in range(2)]
    await claim_until(api, lows[-1]["id"], "ready")
    high = await create_claim(api, priority="high", vcore=40, vmemory="4Gi", count=2)
    assert "waiting for 2 low-priority claim(s)" in high["reason"]
    await claim_until(api, high["id"], "ready")


async def test_a_high_priority_claim_never_evicts_from_a_retired_card(
    api: httpx.AsyncClient, start_agent: StartAgent, engine: AsyncEngine
) -> None:
    """A card its node no longer reports keeps its vGPUs, but nothing new lands there."""
    await short_grace(engine)
    await start_agent(cards=1, memory="8Gi")
    low = await create_claim(api, vmemory="8Gi")
    await claim_until(api, low["id"], "ready")
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE gpus SET retired = true"))
    high = await create_claim(api, priority="high", vcore=40, vmemory="4Gi")
    assert high["status"] == "pending" and "evicted" not in high["reason"]


async def test_the_room_an_eviction_frees_goes_to_the_high_priority_claim_not_a_low_one(
    api: httpx.AsyncClient, start_agent: StartAgent, engine: AsyncEngine, allocator: Allocator
) -> None:
    """The grace period ends (the scan releases the victim) after the pending sweep's
    high-priority pass and before its low-priority pass: that pass must not put the victim
    back into the room, or the high-priority claim waits and evicts again."""
    await short_grace(engine, 30.0)  # the scan run here ends it, not the background one
    await start_agent(cards=1, memory="8Gi")
    low = await create_claim(api, vmemory="8Gi")
    await claim_until(api, low["id"], "ready")
    high = await create_claim(api, priority="high", vcore=40, vmemory="8Gi")
    assert "evicted" in high["reason"]
    async with engine.begin() as conn:
        ending = update(claims).where(claims.c.id == uuid.UUID(low["id"]))
        await conn.execute(ending.values(evict_at=func.now()))

    async def released() -> bool:  # a scan skips a victim another transaction holds locked
        await allocator.dispatcher.scan()
        return (await api.get(f"/v1/claims/{low['id']}")).json()["status"] != "ready"

    await eventually(released)
    async with engine.begin() as conn:  # the sweep's low-priority pass
        await allocator.claims.place_pending(conn, None, Priority.LOW)
    assert (await api.get(f"/v1/claims/{low['id']}")).json()["status"] == "pending"
    await claim_until(api, high["id"], "ready")


async def test_victims_of_classes_with_different_grace_periods_leave_together(
    api: httpx.AsyncClient, start_agent: StartAgent, engine: AsyncEngine
) -> None:
    """A whole card held by a claim of a short grace and one of a longer: the first to go
    must not be placed back into the room (the only one) before the second goes, or the
    high-priority claim evicts it again."""
    await short_grace(engine, 3.0)
    quick = {"name": f"quick-{uuid.uuid4().hex[:8]}", "provisioner": "qshare",
             "eviction_grace_s": 0.2}  # fmt: skip
    assert (await api.post("/v1/classes", json=quick)).status_code == 201
    await start_agent(cards=1, memory="8Gi")
    await create_claim(api, vmemory="4Gi")
    low = await create_claim(api, vmemory="4Gi", class_name=quick["name"])
    await claim_until(api, low["id"], "ready")
    high = await create_claim(api, priority="high", class_name="whole")
    assert "waiting for 2 low-priority claim(s)" in high["reason"]
    await claim_until(api, high["id"], "ready")
    records = (await api.get("/v1/preemptions")).json()
    assert [r["claim_id"] for r in records].count(low["id"]) == 1


async def test_a_waiting_claim_evicts_while_claims_are_evicted_for_another(
    api: httpx.AsyncClient, start_agent: StartAgent, engine: AsyncEngine
) -> None:
    """Claim a's eviction runs (30 s grace) on one node; b waits on the other node until a
    high-priority claim leaves there, then evicts for itself without waiting for a's."""
    await short_grace(engine, 30.0)
    await start_agent(cards=1, memory="16Gi", labels={"pool": "a"})
    await start_agent(cards=1, memory="16Gi", labels={"pool": "b"})
    first = await create_claim(api, node_selector={"pool": "a"}, vmemory="16Gi", vcore=10)
    held = await create_claim(
        api, priority="high", node_selector={"pool": "b"}, vcore=40, vmemory="8Gi"
    )
    second = await create_claim(api, node_selector={"pool": "b"}, vmemory="8Gi", vcore=10)
    await claim_until(api, second["id"], "ready")
    a = await create_claim(
        api, priority="high", node_selector={"pool": "a"}, vcore=40, vmemory="8Gi"
    )
    assert "waiting for 1 low-priority claim(s)" in a["reason"]
    b = await create_claim(
        api, priority="high", node_selector={"pool": "b"}, vcore=40, vmemory="10Gi"
    )
    assert b["status"] == "pending" and "evicted" not in b["reason"]
    assert (await api.delete(f"/v1/claims/{held['id']}")).status_code == 200

    async def evicting() -> bool:
        body = (await api.get(f"/v1/claims/{b['id']}")).json()
        return "waiting for 1 low-priority claim(s)" in (body.get("reason") or "")

    await eventually(evicting, 10)
    records = (await api.get("/v1/preemptions", params={"kind": "eviction"})).json()
    assert sorted(r["claim_id"] for r in records) == sorted([first["id"], second["id"]])


async def test_the_eviction_record_of_a_victim_deleted_during_its_grace_ends(
    api: httpx.AsyncClient, start_agent: StartAgent, engine: AsyncEngine
) -> None:
    await short_grace(engine, 30.0)
    await start_agent(cards=1, memory="4Gi")
    low = await create_claim(api, vmemory="4Gi")
    await claim_until(api, low["id"], "ready")
    high = await create_claim(api, priority="high", vcore=50, vmemory="4Gi")
    assert "waiting for 1 low-priority claim(s)" in high["reason"]
    assert (await api.delete(f"/v1/claims/{low['id']}")).status_code == 200

    async def ended() -> bool:
        records = (await api.get("/v1/preemptions", params={"claim": low["id"]})).json()
        return [r["ended_at"] is not None for r in records] == [True]

    await eventually(ended, 10)
    await claim_until(api, high["id"], "ready")
