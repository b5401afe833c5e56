"""A node deleted over REST whose running agent registers again for a label change before
any heartbeat (so before the allocator's `cmd.register`, which makes the agent count
generations afresh) comes back as a new row: its applies must reach the agent, which still
holds the generation it applied of the old row. Real agent, allocator, Postgres and NATS."""

from __future__ import annotations

import httpx
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.contracts.schema import nodes

from .conftest import StartAgent, claim_until, create_claim, eventually, ready_claim


async def _generations(engine: AsyncEngine, node: str) -> tuple[int, int]:
    query = select(nodes.c.applied_generation, nodes.c.desired_generation)
    async with engine.connect() as conn:
        applied, desired = (await conn.execute(query.where(nodes.c.name == node))).one()
    return int(applied), int(desired)


async def test_a_deleted_node_registered_again_for_its_labels_takes_its_new_rows_applies(
    api: httpx.AsyncClient, engine: AsyncEngine, start_agent: StartAgent
) -> None:
    """Before: the new row counted from 0 while the agent held the old row's generation, so
    it answered every apply as stale; a claim placed there stayed `placed`, and the vGPUs
    of the claims the deletion failed stayed on the card, until the new row's generation
    passed the old one."""
    agent = await start_agent(cards=1, heartbeat_s=300)  # no heartbeat: no cmd.register
    kept = [await ready_claim(api) for _ in range(3)]
    for claim in kept[1:]:
        assert (await api.delete(f"/v1/claims/{claim['id']}")).status_code == 200

    async def one_left() -> bool:
        return len(agent.applied) == 1  # the deleted claims' vGPUs are gone

    await eventually(one_left, 10)
    held = agent.registration().applied_generation
    assert held >= 5 and len(agent.applied) == 1
    removed = await api.delete(f"/v1/nodes/{agent.name}")
    assert removed.json()["failed_claims"] == [kept[0]["id"]]

    # what the agent's next heartbeat tick does once it read a changed Node label
    agent._node_labels = {"zone": "b"}
    assert await agent._relabel()
    assert agent.reregistrations == 0  # not the cmd.register path

    async def emptied() -> bool:
        return not agent.applied  # the failed claim's vGPU is gone

    await eventually(emptied, 10)
    again = await create_claim(api)
    assert (await claim_until(api, again["id"], "ready", 10))["node"] == agent.name
    applied, desired = await _generations(engine, agent.name)
    assert applied == desired > held
