"""A node agent tells its kubelet plugins about its cards' health by itself, not through
the heartbeats (which wait for the allocator): with NATS down, since the agent's start or
since after it, a card that turns unhealthy is still withdrawn from the device plugin's
ListAndWatch and marked (and its device tainted) in the ResourceSlice."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from qshare.testing.servers import EmbeddedNats
from qshare_node_agent.app import NodeAgent
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.settings import NodeAgentSettings

from .conftest import NODE
from .doubles import ApiServerDouble, KubeletDouble

SLICE = f"/apis/resource.k8s.io/v1/resourceslices/{NODE}-qshare-io"


@pytest.fixture
async def nats() -> AsyncIterator[EmbeddedNats]:
    """A NATS of this test's own, with no allocator on it: the agent never registers, so it
    sends no heartbeat; the test then stops it."""
    async with EmbeddedNats() as server:
        yield server


def agent_on(nats: EmbeddedNats, short_dir: Path) -> NodeAgent:
    (short_dir / "shm").mkdir()
    settings = NodeAgentSettings(
        name=NODE, nats_url=nats.url, simulate="2:16Gi", shm_dir=short_dir / "shm",
        heartbeat_s=0.1, kubernetes=True, sim_unhealthy_file=short_dir / "unhealthy",
        keep_segment_on_stop=False,
    )  # fmt: skip
    return NodeAgent(settings)


@pytest.fixture
async def agent(
    plugin_env: KubernetesSettings, short_dir: Path, nats: EmbeddedNats
) -> AsyncIterator[NodeAgent]:
    node = agent_on(nats, short_dir)
    await node.start()
    yield node
    await node.stop()


@pytest.fixture
async def agent_starting(
    plugin_env: KubernetesSettings, short_dir: Path, nats: EmbeddedNats
) -> AsyncIterator[NodeAgent]:
    """An agent started while NATS is down: its start waits for NATS, which comes back
    when the test is done with it."""
    await nats.stop()
    node = agent_on(nats, short_dir)
    starting = asyncio.create_task(node.start())
    yield node
    await nats.start()
    await asyncio.wait_for(starting, 30)
    await node.stop()


async def within(call: Any, *args: Any) -> Any:
    return await asyncio.wait_for(asyncio.to_thread(call, *args), 20)


def unhealthy_cards(listed: Any) -> set[str]:
    return {d.ID.rsplit("-c", 1)[0] for d in listed.devices if d.health == "Unhealthy"}


def slice_health(apiserver: ApiServerDouble) -> dict[str, bool]:
    devices = apiserver.objects.get(SLICE, {}).get("spec", {}).get("devices", [])
    return {d["name"]: d["attributes"]["healthy"]["bool"] for d in devices}


async def test_a_card_that_turns_unhealthy_with_nats_down_is_withdrawn_from_kubernetes(
    agent: NodeAgent,
    nats: EmbeddedNats,
    plugin_env: KubernetesSettings,
    apiserver: ApiServerDouble,
    short_dir: Path,
) -> None:
    await nats.stop()
    assert not agent.registered.is_set()
    await card_turns_unhealthy(agent, plugin_env, apiserver, short_dir)


async def test_an_agent_started_with_nats_down_serves_its_cards_health_to_kubernetes(
    agent_starting: NodeAgent,
    plugin_env: KubernetesSettings,
    apiserver: ApiServerDouble,
    short_dir: Path,
) -> None:
    await served(plugin_env.device_plugin_dir / "qshare-vcore.sock")
    await card_turns_unhealthy(agent_starting, plugin_env, apiserver, short_dir)


async def served(path: Path) -> None:
    async with asyncio.timeout(20):
        while not path.exists():
            await asyncio.sleep(0.05)


async def card_turns_unhealthy(
    agent: NodeAgent, plugin_env: KubernetesSettings, apiserver: ApiServerDouble, short_dir: Path
) -> None:
    """Card 1 turns unhealthy: ListAndWatch sends it as such, the slice marks it."""
    kubelet = KubeletDouble()
    try:
        stream = kubelet.list_and_watch(plugin_env.device_plugin_dir / "qshare-vcore.sock")
        assert unhealthy_cards(await within(next, stream)) == set()
        (short_dir / "unhealthy").write_text(agent.cards[1].uuid)
        async with asyncio.timeout(20):  # lists sent meanwhile (the same health) are skipped
            while unhealthy_cards(await within(next, stream)) != {agent.cards[1].uuid}:
                pass
    finally:
        kubelet.close()
    async with asyncio.timeout(20):
        while slice_health(apiserver) != {"gpu-0": True, "gpu-1": False}:
            await asyncio.sleep(0.05)
    devices = apiserver.objects[SLICE]["spec"]["devices"]
    assert [[t["key"] for t in d.get("taints", [])] for d in devices] == [
        [],
        ["qshare.io/unhealthy"],
    ]
