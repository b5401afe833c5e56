"""Low-priority claims evicted for a high-priority claim are kept when that claim no longer
waits for them once their grace is over (deleted meanwhile): nobody is evicted for nothing."""

from __future__ import annotations

import uuid

from nats.aio.client import Client
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.contracts import envelope, rpc, subjects
from qshare.contracts.claims import ClaimView, DeleteClaim
from tests.controlplane.conftest import Claim, Register, claim_status, eventually

CLASS = "evict-in-3s"


async def _quick_class(engine: AsyncEngine) -> None:
    """An evictable class whose grace outlasts a delete and passes within the test."""
    async with engine.begin() as conn:
        await conn.execute(
            text("INSERT INTO classes (name, provisioner, eviction_grace_s) "
                 "VALUES (:name, 'qshare', 3) ON CONFLICT (name) DO NOTHING"),
            {"name": CLASS},
        )  # fmt: skip


async def _eviction_ended(engine: AsyncEngine, victim: uuid.UUID) -> bool:
    async with engine.connect() as conn:
        query = text(
            "SELECT count(*) FROM preemptions WHERE claim_id = :id AND kind = 'eviction' "
            "AND ended_at IS NOT NULL"
        )
        return bool((await conn.execute(query, {"id": victim})).scalar_one())


async def test_a_victim_of_a_claim_deleted_during_its_grace_keeps_its_card(
    nc: Client, engine: AsyncEngine, register: Register, claim: Claim
) -> None:
    await _quick_class(engine)
    await register("evict-1", cards=1, memory="16Gi")
    victim = await claim("team-a", priority="low", vmemory="12Gi", class_name=CLASS)
    waiting = await claim("team-b", priority="high", vmemory="8Gi")
    assert waiting.status.value == "pending", waiting
    await rpc.call(nc, subjects.CLAIMS_DELETE, "test", DeleteClaim(claim_id=waiting.id), ClaimView)
    await eventually(lambda: _eviction_ended(engine, victim.id))
    assert await claim_status(engine, victim.id) == "placed"


async def test_a_called_off_eviction_tells_the_victims_watchers(
    nc: Client, engine: AsyncEngine, register: Register, claim: Claim
) -> None:
    await _quick_class(engine)
    await register("evict-1", cards=1, memory="16Gi")
    victim = await claim("team-a", priority="low", vmemory="12Gi", class_name=CLASS)
    js = nc.jetstream()
    sub = await js.subscribe(subjects.claim_event(str(victim.id), "*"), ordered_consumer=True)
    waiting = await claim("team-b", priority="high", vmemory="8Gi")
    await rpc.call(nc, subjects.CLAIMS_DELETE, "test", DeleteClaim(claim_id=waiting.id), ClaimView)
    kinds = []
    while "evicting" not in kinds:
        kinds.append((await sub.next_msg(timeout=10)).subject.rsplit(".", 1)[1])
    after = envelope.decode((await sub.next_msg(timeout=10)).data).data
    await sub.unsubscribe()
    assert isinstance(after, dict)
    assert after["status"] == "placed" and after["evict_at"] is None
    assert "eviction called off" in after["reason"], after
