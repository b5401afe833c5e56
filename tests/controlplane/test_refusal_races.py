"""Races with a removal: a node's refusal of a vGPU fails the claim only while the claim
still holds it (a claim deleted while the answer was on its way stays deleted, no `failed`
after its release), and a sharing request for a card removed while it waited is a 404."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from nats.aio.client import Client
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.contracts import rpc, subjects
from qshare.contracts.claims import DeleteClaim
from qshare.contracts.domain import CardPolicy
from qshare.contracts.errors import NotFound
from qshare.contracts.nodes import GpuView
from qshare.contracts.sharing import ChangeSharing, SharingSettings
from qshare_allocator.claims.service import ClaimService
from tests.controlplane.conftest import RULES, Claim, claim_status, eventually
from tests.controlplane.refusing_agent import held_refuser
from tests.controlplane.test_sharing_requests import register_with_agent

NODE = "refuser"


async def _someone_waits_for_a_lock(engine: AsyncEngine) -> bool:
    async with engine.connect() as conn:
        waiting = await conn.execute(text("SELECT count(*) FROM pg_locks WHERE NOT granted"))
        return bool(waiting.scalar_one())


async def _settled(engine: AsyncEngine, claim_id: uuid.UUID) -> bool:
    return await claim_status(engine, claim_id) in ("released", "failed")


async def test_a_refusal_answered_while_the_claim_is_deleted_leaves_it_released(
    nc: Client, engine: AsyncEngine, claim: Claim
) -> None:
    async with held_refuser(nc, NODE) as agent:
        placed = await claim("team-a", priority="low")
        async with engine.begin() as conn:  # a delete, committed once the refusal waits on it
            await ClaimService(RULES, "test").delete(conn, DeleteClaim(claim_id=placed.id))
            agent.release.set()
            await eventually(lambda: _someone_waits_for_a_lock(engine))
        await eventually(lambda: _settled(engine, placed.id))
    assert await claim_status(engine, placed.id) == "released"


async def test_a_sharing_request_for_a_card_removed_meanwhile_is_not_found(
    nc: Client, engine: AsyncEngine
) -> None:
    gpu = await register_with_agent(nc, "sharing-race")
    async with engine.begin() as conn:  # a removal, committed once the request waits on it
        await conn.execute(text("SELECT name FROM nodes WHERE name = 'sharing-race' FOR UPDATE"))
        change = ChangeSharing(uuid=gpu, change=SharingSettings(policy=CardPolicy.FIXED_SHARE))
        asked = asyncio.create_task(rpc.call(nc, subjects.GPUS_SHARING, "test", change, GpuView))
        await eventually(lambda: _someone_waits_for_a_lock(engine))
        await conn.execute(text("DELETE FROM gpus WHERE uuid = :uuid"), {"uuid": gpu})
    with pytest.raises(NotFound):
        await asked
