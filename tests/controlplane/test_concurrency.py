"""Correctness under concurrency: two replicas, 32 requesters, scarce capacity."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.contracts import rpc, subjects
from qshare.contracts.claims import ClaimSpec, CreateClaim, CreateClaimReply
from qshare_allocator.app import Allocator
from qshare_allocator.audit import double_placements, overcommitted_cards
from tests.controlplane.conftest import Register


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
        assert await overcommitted_cards(conn) == 0
        assert await double_placements(conn) == 0
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
