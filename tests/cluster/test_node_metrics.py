"""The node agent's Prometheus `/metrics`: per vGPU figures labelled with the claim that owns
it (so a dashboard joins them to claims and pods), per card high priority's hold and the
release delay in force; each agent serves its own, however many run in one process."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from qshare.testing.servers import free_port
from qshare_node_agent.app import NodeAgent

from .conftest import StartAgent, ready_claim


async def scrape(agent: NodeAgent) -> dict[str, list[Any]]:
    """Samples by metric name, from the agent's own /metrics."""
    url = f"http://127.0.0.1:{agent.settings.metrics_port}/metrics"
    async with httpx.AsyncClient() as client:
        text = (await client.get(url)).text
    found: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


async def test_a_vgpus_figures_carry_the_claim_card_and_priority_that_own_it(
    start_agent: StartAgent, api: httpx.AsyncClient
) -> None:
    agent = await start_agent(cards=1, metrics_port=free_port())
    claim = await ready_claim(api, priority="low", vcore=30, vmemory="2Gi")
    samples = await scrape(agent)
    [limit] = samples["qshare_vgpu_memory_limit_bytes"]
    assert limit.labels["claim"] == claim["id"]
    assert limit.labels["gpu"] == agent.cards[0].uuid
    assert limit.labels["priority"] == "low"
    assert limit.value == 2 * 1024**3
    [share] = samples["qshare_vgpu_core_share_percent"]
    assert share.value == 30
    [suspended] = samples["qshare_vgpu_suspended"]
    assert suspended.value == 0


async def test_a_cards_hold_and_release_delay_in_force_are_served(
    start_agent: StartAgent,
) -> None:
    agent = await start_agent(cards=2, metrics_port=free_port())
    samples = await scrape(agent)
    assert {s.labels["gpu"] for s in samples["qshare_card_busy"]} == {c.uuid for c in agent.cards}
    assert all(s.value == 0 for s in samples["qshare_card_busy"])
    assert all(s.value == agent.settings.release_delay_s
               for s in samples["qshare_card_release_delay_seconds"])  # fmt: skip


async def test_a_cards_policy_wake_ups_are_served_as_a_counter(start_agent: StartAgent) -> None:
    agent = await start_agent(cards=1, metrics_port=free_port())
    samples = await scrape(agent)
    [wakes] = samples["qshare_card_policy_wakes_total"]
    assert wakes.labels["gpu"] == agent.cards[0].uuid
    assert wakes.value == 0


async def test_figures_that_only_grow_are_served_as_counters(
    start_agent: StartAgent, api: httpx.AsyncClient
) -> None:
    agent = await start_agent(cards=1, metrics_port=free_port())
    await ready_claim(api, priority="low", vcore=30, vmemory="1Gi")
    url = f"http://127.0.0.1:{agent.settings.metrics_port}/metrics"
    async with httpx.AsyncClient() as client:
        text = (await client.get(url)).text
    types = {f.name: f.type for f in text_string_to_metric_families(text)}
    grow = ["qshare_vgpu_device_seconds", "qshare_vgpu_launches", "qshare_card_busy_episodes",
            "qshare_card_policy_wakes", "qshare_node_ring_dropped"]  # fmt: skip
    assert {name: types.get(name) for name in grow} == dict.fromkeys(grow, "counter")


async def test_two_agents_in_one_process_each_serve_their_own_cards(
    start_agent: StartAgent,
) -> None:
    first = await start_agent(cards=1, metrics_port=free_port())
    second = await start_agent(cards=1, metrics_port=free_port())
    for agent in (first, second):
        samples = await scrape(agent)
        assert {s.labels["node"] for s in samples["qshare_card_busy"]} == {agent.name}


async def test_an_agent_stopped_no_longer_serves_its_metrics(start_agent: StartAgent) -> None:
    agent = await start_agent(cards=1, metrics_port=free_port())
    await agent.stop()
    url = f"http://127.0.0.1:{agent.settings.metrics_port}/metrics"
    async with httpx.AsyncClient() as client:
        try:
            await client.get(url, timeout=2)
            served = True
        except httpx.ConnectError:
            served = False
    assert not served


async def test_a_vgpu_destroyed_while_a_scrape_reads_it_is_left_out_of_that_scrape(
    start_agent: StartAgent, api: httpx.AsyncClient
) -> None:
    """The scrape's thread reads the held vGPUs, then each one's figures from the driver; an
    apply on the agent's loop may destroy one in between (the driver releases the
    interpreter's lock on every call). Destroying it in the segment stands for that apply:
    the scrape answers with every other figure instead of failing whole."""
    agent = await start_agent(cards=1, metrics_port=free_port())
    await ready_claim(api, priority="low", vcore=30, vmemory="2Gi")
    [local_id] = agent.applied
    agent.node.destroy_vgpu(local_id)
    samples = await scrape(agent)
    assert "qshare_vgpu_memory_limit_bytes" not in samples
    assert {s.labels["gpu"] for s in samples["qshare_card_busy"]} == {agent.cards[0].uuid}
