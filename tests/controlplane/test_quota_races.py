"""Quotas under concurrency: creates of one tenant racing through both replicas (and their
shared transactions) are checked one after another, so none passes a limit."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.contracts import rpc, subjects
from qshare.contracts.claims import ClaimSpec, CreateClaim, CreateClaimReply
from qshare.contracts.errors import Conflict
from qshare_allocator.app import Allocator
from tests.controlplane.conftest import Register


async def _racing_creates(nc: Client, spec: ClaimSpec, requests: int) -> list[object]:
    command = CreateClaim(tenant="capped", spec=spec)
    return await asyncio.gather(
        *(rpc.call(nc, subjects.CLAIMS_CREATE, "t", command, CreateClaimReply, timeout=30)
          for _ in range(requests)),
        return_exceptions=True,
    )  # fmt: skip


async def _quota(engine: AsyncEngine, cards: int | None, pending: int | None) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text("INSERT INTO quotas (tenant, cards, pending) VALUES ('capped', :c, :p)"),
            {"c": cards, "p": pending},
        )


async def _stored(engine: AsyncEngine, status: str) -> int:
    async with engine.connect() as conn:
        query = text("SELECT count(*) FROM claims WHERE tenant = 'capped' AND status = :s")
        return int((await conn.execute(query, {"s": status})).scalar_one())


async def test_racing_creates_of_one_tenant_never_pass_its_card_quota(
    register: Register, nc: Client, engine: AsyncEngine, replicas: list[Allocator]
) -> None:
    for i in range(8):  # room on many nodes: placements do not wait on one node's lock
        await register(f"n{i}", cards=4, memory="80Gi")
    await _quota(engine, cards=5, pending=None)
    spec = ClaimSpec(priority="low", vcore=10, vmemory="1Gi")
    outcomes = await _racing_creates(nc, spec, requests=32)
    assert sum(isinstance(o, CreateClaimReply) for o in outcomes) == 5
    assert sum(isinstance(o, Conflict) for o in outcomes) == 27
    assert await _stored(engine, "placed") == 5


async def test_racing_creates_that_must_wait_never_pass_the_pending_limit(
    register: Register, nc: Client, engine: AsyncEngine, replicas: list[Allocator]
) -> None:
    await register("n1", cards=1, memory="16Gi")
    await _quota(engine, cards=None, pending=3)
    spec = ClaimSpec(priority="low", vcore=10, vmemory="1Gi", node_selector={"zone": "none"})
    outcomes = await _racing_creates(nc, spec, requests=32)
    assert sum(isinstance(o, CreateClaimReply) for o in outcomes) == 3
    assert await _stored(engine, "pending") == 3
