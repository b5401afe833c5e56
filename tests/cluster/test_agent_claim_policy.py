"""A DRA claim's card policy outlives an agent restart: a card a prepared claim asked a
policy of keeps it when the restarted agent adopts the segment, while a card no claim holds
takes the agent's settings again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from qshare.contracts.domain import CardPolicy
from qshare.envsettings import load
from qshare.testing.kube_apiserver import ApiServerDouble
from qshare_node_agent.app import NodeAgent
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.settings import NodeAgentSettings
from tests.kubernetes.conftest import resource_claim, store_claim
from tests.kubernetes.doubles import KubeletDouble

from .test_agent_kubernetes import NODE, kube

__all__ = ["kube"]  # the API server double and the plugins' settings, as a fixture


def settings(bus_url: str, shm_dir: Path, keep: bool) -> NodeAgentSettings:
    return NodeAgentSettings(
        name=NODE, nats_url=bus_url, simulate="2:16Gi", shm_dir=shm_dir, heartbeat_s=0.5,
        kubernetes=True, policy=CardPolicy.BEST_EFFORT, keep_segment_on_stop=keep,
    )  # fmt: skip


def asking(name: str, device: str, policy: str) -> dict[str, Any]:
    parameters = {"apiVersion": "qshare.io/v1", "kind": "VgpuConfig", "policy": policy}
    return resource_claim(name, device=device, node=NODE, parameters=parameters)


async def call(kubelet: KubeletDouble, verb: str, claim: tuple[str, str, str]) -> None:
    socket = load(KubernetesSettings).dra_socket
    answer = await asyncio.to_thread(getattr(kubelet, verb), socket, [claim])
    assert answer.claims[claim[2]].error == ""


def policies(agent: NodeAgent) -> list[str]:
    return [agent.node.card_stats(c.index).policy.label for c in agent.cards]


async def test_a_restart_keeps_the_policy_a_live_claim_asked_and_resets_the_others(
    kube: ApiServerDouble, bus_url: str, tmp_path: Path
) -> None:
    kubelet = KubeletDouble()
    first = NodeAgent(settings(bus_url, tmp_path, keep=True))
    await first.start()
    try:
        held = store_claim(kube, asking("held", "gpu-0", "fixed-share"))
        gone = store_claim(kube, asking("gone", "gpu-1", "burst-share"))
        for claim in (held, gone):
            await call(kubelet, "prepare", claim)
        await call(kubelet, "unprepare", gone)
        assert policies(first) == ["fixed-share", "burst-share"]
    finally:
        await first.stop()
        kubelet.close()
    second = NodeAgent(settings(bus_url, tmp_path, keep=False))
    await second.start()
    try:
        assert policies(second) == ["fixed-share", "best-effort"]
    finally:
        await second.stop()
