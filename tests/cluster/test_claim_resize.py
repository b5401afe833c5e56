"""`PATCH /v1/claims/{id}` resizes a claim where it runs: the allocator records the new size
on the claim's cards when they have room, the node agent applies it to the running vGPU,
and a shrink makes room that a pending claim then takes."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
from nats.aio.client import Client as Nats
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare import bus
from qshare.contracts.schema import gpus, nodes

from .conftest import StartAgent, claim_until, create_claim, eventually, ready_claim

GIB = 1024 * 1024 * 1024


async def _patch(api: httpx.AsyncClient, claim: dict[str, Any], **change: Any) -> httpx.Response:
    return await api.patch(f"/v1/claims/{claim['id']}", json=change)


async def test_a_ready_claim_grows_and_its_node_applies_the_new_limits(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    agent = await start_agent(cards=1)
    claim = await ready_claim(api, vcore=20, vmemory="2Gi")
    resized = await _patch(api, claim, vcore=40, vmemory="4Gi")
    assert resized.status_code == 200, resized.text
    assert (resized.json()["vcore"], resized.json()["vmemory_mib"]) == (40, 4096)
    local_id = claim["vgpus"][0]["local_id"]

    async def applied() -> bool:
        stats = agent.node.vgpu_stats(local_id)
        return (stats.core_share, stats.mem_limit) == (40, 4 * GIB)

    await eventually(applied)
    assert (await api.get(f"/v1/claims/{claim['id']}")).json()["status"] == "ready"


async def test_a_growth_past_the_cards_free_memory_is_409_naming_the_card_and_changes_nothing(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    await start_agent(cards=1, memory="16Gi")
    claim = await ready_claim(api, vmemory="2Gi")
    await ready_claim(api, vmemory="12Gi")
    refused = await _patch(api, claim, vmemory="6Gi")
    assert refused.status_code == 409, refused.text
    assert claim["vgpus"][0]["gpu"] in refused.json()["detail"]
    assert [e["field"] for e in refused.json()["errors"]] == ["vmemory"]
    assert (await api.get(f"/v1/claims/{claim['id']}")).json()["vmemory_mib"] == 2048
    [node] = (await api.get("/v1/nodes")).json()
    assert node["free_mib"] == 2048


async def test_a_growth_past_the_cards_free_core_share_is_409_naming_vcore(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    await start_agent(cards=1)
    claim = await ready_claim(api, vcore=30)
    await ready_claim(api, vcore=60)
    refused = await _patch(api, claim, vcore=50)
    assert refused.status_code == 409, refused.text
    assert [e["field"] for e in refused.json()["errors"]] == ["vcore"]


async def test_a_shrink_makes_room_that_a_pending_claim_takes(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    await start_agent(cards=1, memory="16Gi")
    big = await ready_claim(api, vmemory="12Gi")
    waiting = await create_claim(api, vmemory="8Gi")
    assert waiting["status"] == "pending"
    assert (await _patch(api, big, vmemory="4Gi")).status_code == 200
    await claim_until(api, waiting["id"], "ready")


async def test_a_pending_claim_is_placed_at_its_new_size(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    await start_agent(cards=1, memory="16Gi")
    await ready_claim(api, vmemory="12Gi")
    waiting = await create_claim(api, vmemory="8Gi")
    assert waiting["status"] == "pending"
    assert (await _patch(api, waiting, vmemory="4Gi")).status_code == 200
    placed = await claim_until(api, waiting["id"], "ready")
    assert placed["vgpus"][0]["vmemory_mib"] == 4096


async def test_a_pending_claim_resized_past_every_card_is_422_and_keeps_its_size(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    await start_agent(cards=1, memory="16Gi")
    await ready_claim(api, vmemory="12Gi")
    waiting = await create_claim(api, vmemory="8Gi")
    refused = await _patch(api, waiting, vmemory="32Gi")
    assert refused.status_code == 422
    assert "more than any card" in refused.json()["detail"]
    assert (await api.get(f"/v1/claims/{waiting['id']}")).json()["vmemory_mib"] == 8192


async def _counters(engine: AsyncEngine, node: str) -> tuple[Any, ...]:
    """The node's and its cards' capacity counters as stored."""
    async with engine.connect() as conn:
        node_row = (
            await conn.execute(
                select(nodes.c.free_mib, nodes.c.core_high, nodes.c.core_low).where(
                    nodes.c.name == node
                )
            )
        ).one()
        cards = (
            await conn.execute(
                select(gpus.c.uuid, gpus.c.allocated_mib, gpus.c.core_high, gpus.c.core_low,
                       gpus.c.vgpu_count)
                .where(gpus.c.node_name == node)
                .order_by(gpus.c.uuid)
            )
        ).all()  # fmt: skip
    return tuple(node_row), [tuple(card) for card in cards]


async def test_deleting_resized_claims_gives_back_exactly_what_they_held(
    api: httpx.AsyncClient, start_agent: StartAgent, engine: AsyncEngine
) -> None:
    agent = await start_agent(cards=2, memory="16Gi")
    before = await _counters(engine, agent.name)
    pair = await ready_claim(api, priority="high", vcore=20, vmemory="2Gi", count=2)
    low = await ready_claim(api, vcore=30, vmemory="4Gi")
    assert (await _patch(api, pair, vcore=45, vmemory="5Gi")).status_code == 200
    assert (await _patch(api, low, vcore=10, vmemory="1Gi")).status_code == 200
    assert (await _patch(api, low, vmemory="3Gi")).status_code == 200
    assert (await _patch(api, pair, vcore=15)).status_code == 200
    during = await _counters(engine, agent.name)
    assert during[0] == (before[0][0] - 2 * 5120 - 3072, 2 * 15, 10)
    assert sum(card[4] for card in during[1]) == 3
    for claim in (pair, low):
        assert (await api.delete(f"/v1/claims/{claim['id']}")).status_code == 200

    async def released() -> bool:  # a released claim is no longer found by id
        gone = [await api.get(f"/v1/claims/{c['id']}") for c in (pair, low)]
        return all(r.status_code == 404 for r in gone)

    await eventually(released)
    assert await _counters(engine, agent.name) == before


async def test_a_resize_publishes_a_resized_event(
    api: httpx.AsyncClient, start_agent: StartAgent, nc: Nats
) -> None:
    await start_agent(cards=1)
    claim = await ready_claim(api)
    sub = await nc.subscribe(f"qshare.evt.claim.{claim['id']}.resized")
    await bus.settled(nc)
    assert (await _patch(api, claim, vcore=25)).status_code == 200
    event = await sub.next_msg(timeout=10)
    assert b'"vcore":25' in event.data.replace(b" ", b"")
    await sub.unsubscribe()


async def test_a_claim_of_whole_cards_cannot_be_resized(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    await start_agent(cards=1)
    whole = await ready_claim(api, class_name="whole")
    refused = await _patch(api, whole, vmemory="4Gi")
    assert refused.status_code == 409
    assert "whole cards" in refused.json()["detail"]


async def test_a_releasing_claim_cannot_be_resized(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    agent = await start_agent(cards=1)
    claim = await ready_claim(api)
    await agent.stop()  # nobody confirms the release: the claim stays releasing
    assert (await api.delete(f"/v1/claims/{claim['id']}")).json()["status"] == "releasing"
    refused = await _patch(api, claim, vcore=30)
    assert refused.status_code == 409
    assert "only pending, placed and ready" in refused.json()["detail"]


async def test_a_resize_that_names_nothing_is_422(api: httpx.AsyncClient) -> None:
    refused = await api.patch("/v1/claims/00000000-0000-0000-0000-000000000001", json={})
    assert refused.status_code == 422
    assert "vcore, vmemory or both" in refused.text


async def _staying_class(api: httpx.AsyncClient) -> str:
    """A class whose claims stay on a sick card or node rather than being placed again."""
    stays = {"name": f"stays-{uuid.uuid4().hex[:8]}", "provisioner": "qshare",
             "replace_on_failure": False}  # fmt: skip
    assert (await api.post("/v1/classes", json=stays)).status_code == 201
    return stays["name"]


async def test_a_claim_on_an_unhealthy_card_may_shrink_but_not_grow(
    api: httpx.AsyncClient, start_agent: StartAgent, tmp_path: Path
) -> None:
    health = tmp_path / "unhealthy"
    await start_agent(cards=1, sim_unhealthy_file=health)
    claim = await ready_claim(api, class_name=await _staying_class(api), vmemory="4Gi")
    sick = claim["vgpus"][0]["gpu"]
    health.write_text(sick)

    async def degraded() -> bool:
        found = (await api.get(f"/v1/claims/{claim['id']}")).json()
        return str(found["reason"] or "").startswith("degraded")

    await eventually(degraded)
    refused = await _patch(api, claim, vmemory="8Gi")
    assert refused.status_code == 409, refused.text
    assert f"card {sick} is unhealthy" in refused.json()["detail"]
    assert (await _patch(api, claim, vmemory="2Gi")).status_code == 200


async def test_a_claim_on_a_not_ready_node_may_shrink_but_not_grow(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    agent = await start_agent(cards=1)
    claim = await ready_claim(api, class_name=await _staying_class(api), vmemory="4Gi")
    await agent.stop()

    async def not_ready() -> bool:
        return bool((await api.get(f"/v1/nodes/{agent.name}")).json()["status"] == "NotReady")

    await eventually(not_ready)
    refused = await _patch(api, claim, vcore=60)
    assert refused.status_code == 409, refused.text
    assert f"node {agent.name} is NotReady" in refused.json()["detail"]
    assert (await api.get(f"/v1/claims/{claim['id']}")).json()["vcore"] == 20
    assert (await _patch(api, claim, vmemory="2Gi")).status_code == 200
