"""Correctness under concurrency: two replicas, 32 requesters, scarce capacity."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.contracts import rpc, subjects
from qshare.contracts.claims import ClaimSpec, CreateClaim, CreateClaimReply
from qshare_allocator.app import Allocator
from tests.controlplane.conftest import Register

OVERCOMMITTED = """
SELECT count(*) FROM (
  SELECT g.uuid FROM gpus g LEFT JOIN vgpus v ON v.gpu_uuid = g.uuid
  GROUP BY g.uuid, g.memory_mib, g.max_vgpus
  HAVING coalesce(sum(v.vmemory_mib), 0) > g.memory_mib
      OR coalesce(sum(v.vcore) FILTER (WHERE v.priority = 'high'), 0) > 100
      OR coalesce(sum(v.vcore) FILTER (WHERE v.priority = 'low'), 0) > 100
      OR count(v.id) > g.max_vgpus
) over
"""
DOUBLE_PLACED = """
SELECT count(*) FROM claims c LEFT JOIN vgpus v ON v.claim_id = c.id
WHERE c.status IN ('placed', 'ready')
GROUP BY c.id, c.count HAVING count(v.id) <> c.count OR count(DISTINCT v.node_name) > 1
"""


async def _race(nc: Client, requests: int, requesters: int) -> list[CreateClaimReply]:
    spec = ClaimSpec(priority="high", vcore=30, vmemory="4Gi")
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    replies: list[CreateClaimReply] = []

    async def requester(n: int) -> None:
        while not queue.empty():
            queue.get_nowait()
            command = CreateClaim(tenant=f"t{n}", spec=spec)
            replies.append(
                await rpc.call(
                    nc, subjects.CLAIMS_CREATE, "t", command, CreateClaimReply, timeout=30
                )
            )

    await asyncio.gather(*(requester(n) for n in range(requesters)))
    return replies


async def test_racing_requesters_never_oversubscribe_a_card(
    register: Register, nc: Client, engine: AsyncEngine, replicas: list[Allocator]
) -> None:
    for i in range(4):
        await register(f"n{i}", cards=2, memory="16Gi")  # 8 cards × 3 claims of 30 % = 24 fit
    replies = await _race(nc, requests=96, requesters=32)
    async with engine.connect() as conn:
        overcommitted = (await conn.execute(text(OVERCOMMITTED))).scalar_one()
        double = (await conn.execute(text(DOUBLE_PLACED))).scalars().all()
    assert overcommitted == 0
    assert double == []
    assert sum(r.claim.status == "placed" for r in replies) == 24


async def test_both_replicas_serve_requests(
    register: Register, nc: Client, replicas: list[Allocator]
) -> None:
    await register("n1", cards=8, memory="80Gi")
    before = [_served(r) for r in replicas]
    await _race(nc, requests=64, requesters=32)
    assert all(_served(r) > b for r, b in zip(replicas, before, strict=True))


def _served(replica: Allocator) -> int:
    return replica.served


async def test_racing_twins_with_one_idempotency_key_make_one_claim(
    register: Register, nc: Client, engine: AsyncEngine
) -> None:
    await register("n1", cards=2)
    spec = ClaimSpec(priority="low", vcore=10, vmemory="1Gi", idempotency_key="twin")
    command = CreateClaim(tenant="team-a", spec=spec)
    replies = await asyncio.gather(
        *(rpc.call(nc, subjects.CLAIMS_CREATE, "t", command, CreateClaimReply, timeout=30)
          for _ in range(8))
    )  # fmt: skip
    async with engine.connect() as conn:
        stored = (await conn.execute(text("SELECT count(*) FROM claims"))).scalar_one()
    assert len({r.claim.id for r in replies}) == 1
    assert stored == 1
    assert sum(r.created for r in replies) == 1
