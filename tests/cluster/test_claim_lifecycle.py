"""A claim becomes a running vGPU: placed, applied by the node agent, ready; deleted, gone."""

from __future__ import annotations

import httpx

from qshare_node_agent.app import NodeAgent

from .conftest import StartAgent, claim_until, create_claim, eventually

GIB = 1 << 30


async def test_a_claim_becomes_ready_once_its_node_applied_it(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    agent = await start_agent()
    claim = await create_claim(api)
    ready = await claim_until(api, str(claim["id"]), "ready")
    vgpu = ready["vgpus"][0]
    assert vgpu["segment"] == agent.settings.segment_name
    assert agent.node.vgpu_stats(vgpu["local_id"]).mem_limit == 2 * GIB


async def test_a_deleted_claim_leaves_the_segment(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    agent = await start_agent()
    claim = await create_claim(api)
    ready = await claim_until(api, str(claim["id"]), "ready")
    local_id = ready["vgpus"][0]["local_id"]
    assert (await api.delete(f"/v1/claims/{claim['id']}")).status_code in (200, 202, 204)

    async def gone() -> bool:
        return local_id not in agent_vgpus(agent)

    await eventually(gone)


def agent_vgpus(agent: NodeAgent) -> set[int]:
    return set(agent.applied)
