"""`PATCH /v1/claims/{id}` resizes a claim where it runs: the allocator records the new size
on the claim's cards when they have room, the node agent applies it to the running vGPU,
and a shrink makes room that a pending claim then takes."""

from __future__ import annotations

from typing import Any

import httpx
from nats.aio.client import Client as Nats

from qshare import bus

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
