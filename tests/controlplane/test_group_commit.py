"""Group commit: concurrent claim creations share a transaction, each answered after its commit,
and one refused claim does not fail the others."""

from __future__ import annotations

import asyncio
from typing import Any

from nats.aio.client import Client
from prometheus_client import REGISTRY
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from qshare.contracts import subjects
from qshare.contracts.claims import ClaimSpec, CreateClaim, CreateClaimReply
from qshare.contracts.errors import Conflict
from qshare_allocator.app import Allocator
from qshare_allocator.audit import double_placements, overcommitted_cards
from qshare_allocator.claims.service import ClaimService
from qshare_allocator.groupcommit import GroupCommit
from tests.controlplane.conftest import RULES, Register
from tests.controlplane.test_concurrency import _race


def _group(engine: AsyncEngine) -> GroupCommit:
    return GroupCommit(engine, max_group=16, max_open=1, name="test")


async def _transaction_id(conn: AsyncConnection) -> int:
    return int((await conn.execute(text("SELECT txid_current()"))).scalar_one())


async def test_calls_made_together_share_one_transaction(engine: AsyncEngine) -> None:
    group = _group(engine)
    ids = await asyncio.gather(*(group.run(_transaction_id) for _ in range(4)))
    assert len(set(ids)) == 1


async def test_a_caller_gets_its_result_only_once_its_write_is_committed(
    engine: AsyncEngine,
) -> None:
    async def write(conn: AsyncConnection) -> None:
        await conn.execute(text("INSERT INTO outbox (subject, body, headers) VALUES "
                                "('test.committed', '\\x00', '{}')"))  # fmt: skip

    await _group(engine).run(write)
    async with engine.connect() as conn:
        seen = await conn.execute(text("SELECT count(*) FROM outbox WHERE subject = "
                                       "'test.committed'"))  # fmt: skip
        assert seen.scalar_one() == 1


def _create(service: ClaimService, tenant: str) -> Any:
    spec = ClaimSpec(priority="low", vcore=10, vmemory="1Gi")

    async def work(conn: AsyncConnection) -> CreateClaimReply:
        return await service.create(conn, CreateClaim(tenant=tenant, spec=spec))

    return work


async def test_a_refused_claim_fails_alone_and_the_others_of_its_group_are_placed(
    register: Register, engine: AsyncEngine
) -> None:
    await register("n1", cards=2)
    async with engine.begin() as conn:
        await conn.execute(text("INSERT INTO quotas (tenant, cards) VALUES ('capped', 1)"))
    service, group = ClaimService(RULES, "test"), _group(engine)
    outcomes = await asyncio.gather(
        *(group.run(_create(service, t)) for t in ("team-a", "capped", "capped", "team-b")),
        return_exceptions=True,
    )
    assert [type(o) for o in outcomes] == [CreateClaimReply, CreateClaimReply, Conflict,
                                           CreateClaimReply]  # fmt: skip
    async with engine.connect() as conn:
        stored = await conn.execute(text("SELECT tenant FROM claims WHERE status = 'placed'"))
        assert sorted(stored.scalars()) == ["capped", "team-a", "team-b"]


def _shared() -> float:
    """Claim creations that shared a transaction with others, over the replicas' lifetime."""
    labels = {"handler": subjects.CLAIMS_CREATE}
    count = REGISTRY.get_sample_value("qshare_allocator_group_commit_size_count", labels) or 0.0
    alone = REGISTRY.get_sample_value(
        "qshare_allocator_group_commit_size_bucket", labels | {"le": "1.0"}
    )
    return count - (alone or 0.0)


async def test_two_replicas_sharing_transactions_never_oversubscribe_a_card(
    register: Register, nc: Client, engine: AsyncEngine, replicas: list[Allocator]
) -> None:
    for i in range(4):
        await register(f"n{i}", cards=2, memory="16Gi")  # 8 cards × 3 claims of 30 % = 24 fit
    before = _shared()
    replies = await _race(nc, requests=96, requesters=32)
    assert _shared() > before
    async with engine.connect() as conn:
        assert await overcommitted_cards(conn) == 0
        assert await double_placements(conn) == 0
    assert sum(r.claim.status == "placed" for r in replies) == 24
