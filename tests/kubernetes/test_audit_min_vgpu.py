"""A node agent serving the kubelet takes the smallest claim its ResourceSlice offers: the
minimum the slice publishes (QSHARE_K8S_MIN_VGPU_MIB) is the one its prepares hold to,
never a second setting of the agent's that the scheduler cannot see."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from qshare.testing.servers import EmbeddedNats
from qshare_node_agent.app import NodeAgent
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.settings import NodeAgentSettings

from .conftest import NODE, resource_claim, store_claim
from .doubles import ApiServerDouble, KubeletDouble

SLICE = f"/apis/resource.k8s.io/v1/resourceslices/{NODE}-qshare-io"
SMALLEST = "512Mi"


@pytest.fixture
def smallest_512mib(plugin_env: KubernetesSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QSHARE_K8S_MIN_VGPU_MIB", "512")


@pytest.fixture
async def agent(
    smallest_512mib: None, plugin_env: KubernetesSettings, short_dir: Path
) -> AsyncIterator[NodeAgent]:
    (short_dir / "shm").mkdir()
    async with EmbeddedNats() as nats:
        settings = NodeAgentSettings(
            name=NODE, nats_url=nats.url, simulate="2:16Gi", shm_dir=short_dir / "shm",
            kubernetes=True, keep_segment_on_stop=False,
        )  # fmt: skip
        node = NodeAgent(settings)
        await node.start()
        yield node
        await node.stop()


def slice_minimum(apiserver: ApiServerDouble) -> str | None:
    devices = apiserver.objects.get(SLICE, {}).get("spec", {}).get("devices", [])
    memory = devices[0]["capacity"]["memory"] if devices else {}
    return memory.get("requestPolicy", {}).get("validRange", {}).get("min")


async def test_a_claim_of_the_smallest_memory_the_slice_offers_is_prepared(
    agent: NodeAgent, plugin_env: KubernetesSettings, apiserver: ApiServerDouble
) -> None:
    async with asyncio.timeout(20):
        while slice_minimum(apiserver) is None:
            await asyncio.sleep(0.05)
    assert slice_minimum(apiserver) == SMALLEST
    claim = store_claim(apiserver, resource_claim("small", {"memory": SMALLEST, "cores": "10"}))
    kubelet = KubeletDouble()
    try:
        reply = await asyncio.to_thread(kubelet.prepare, plugin_env.dra_socket, [claim])
    finally:
        kubelet.close()
    assert reply.claims[claim[2]].error == ""
