"""The allocator's desired state carries each vGPU's `suspended` flag, read from the open
preemption records, to agents that announce `apply-suspended` only: an agent of an earlier
version refuses fields it does not know, so its applies carry no such key."""

from __future__ import annotations

import uuid

from nats.aio.client import Client
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.contracts.domain import AGENT_FEATURES_LABEL
from qshare.contracts.schema import preemptions
from qshare_allocator.nodes.desired import desired_state
from tests.controlplane.conftest import Claim
from tests.controlplane.test_sharing_requests import register_with_agent


async def _suspended_by_operator(engine: AsyncEngine, claim_id: uuid.UUID, tenant: str) -> None:
    row = {"claim_id": claim_id, "tenant": tenant, "kind": "operator", "reason": "test"}
    async with engine.begin() as conn:
        await conn.execute(insert(preemptions), [row])


async def test_only_an_agent_announcing_apply_suspended_gets_the_flag(
    nc: Client, engine: AsyncEngine, claim: Claim
) -> None:
    # the earlier agent's node first, alone: its claim needs no selector to land there
    for name, features in (("sus-old", None), ("sus-new", "apply-sharing,apply-suspended")):
        await register_with_agent(nc, name, features=features)
        selector = {AGENT_FEATURES_LABEL: features} if features else {}
        placed = await claim(priority="low", node_selector=selector)
        assert placed.node == name
        await _suspended_by_operator(engine, placed.id, placed.tenant)
    async with engine.connect() as conn:
        new = await desired_state(conn, "sus-new")
        old = await desired_state(conn, "sus-old")
    assert new is not None and [v.suspended for v in new.vgpus] == [True]
    assert new.model_dump(mode="json")["vgpus"][0]["suspended"] is True
    assert old is not None and [v.suspended for v in old.vgpus] == [False]
    assert "suspended" not in old.model_dump(mode="json")["vgpus"][0]
