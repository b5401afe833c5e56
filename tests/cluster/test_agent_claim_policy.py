"""A DRA claim's card policy lasts as long as the claim: a card a prepared claim asked a
policy of keeps it when the restarted agent adopts the segment, while a card no claim holds
takes the agent's settings again, as it does once the last claim asking one is unprepared
(or the sharing the control plane asked of it, when it asked some)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from nats.aio.client import Client as Nats

from qshare.contracts.agent import ApplyDesired
from qshare.contracts.domain import CardPolicy
from qshare.contracts.sharing import SharingSettings, WantedSharing
from qshare.envsettings import load
from qshare.testing.kube_apiserver import ApiServerDouble
from qshare_node_agent.app import NodeAgent
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.local_vgpus import node_checkpoint
from qshare_node_agent.settings import NodeAgentSettings
from tests.kubernetes.conftest import resource_claim, store_claim
from tests.kubernetes.doubles import KubeletDouble

from .test_agent_kubernetes import NODE, kube
from .test_node_commands import apply

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
    finally:
        await first.stop()
        kubelet.close()
    second = NodeAgent(settings(bus_url, tmp_path, keep=False))
    await second.start()
    try:
        assert policies(second) == ["fixed-share", "best-effort"]
    finally:
        await second.stop()


async def test_a_card_takes_the_agents_policy_back_once_no_prepared_claim_asks_one(
    kube: ApiServerDouble, bus_url: str, tmp_path: Path
) -> None:
    kubelet = KubeletDouble()
    agent = NodeAgent(settings(bus_url, tmp_path, keep=False))
    await agent.start()
    try:
        first = store_claim(kube, asking("first", "gpu-0", "fixed-share"))
        second = store_claim(kube, asking("second", "gpu-0", "fixed-share"))
        for claim in (first, second):
            await call(kubelet, "prepare", claim)
        await call(kubelet, "unprepare", first)
        assert policies(agent) == ["fixed-share", "best-effort"]  # the second still asks it
        await call(kubelet, "unprepare", second)
        assert policies(agent) == ["best-effort", "best-effort"]
    finally:
        await agent.stop()
        kubelet.close()


async def test_a_card_takes_back_the_sharing_asked_of_it_once_no_prepared_claim_asks_a_policy(
    kube: ApiServerDouble, bus_url: str, nc: Nats, tmp_path: Path
) -> None:
    kubelet = KubeletDouble()
    agent = NodeAgent(settings(bus_url, tmp_path, keep=False))
    await agent.start()
    try:
        burst = SharingSettings(policy=CardPolicy.BURST_SHARE)
        asked = [WantedSharing(gpu=agent.cards[0].uuid, settings=burst)]
        await apply(nc, NODE, ApplyDesired(node=NODE, generation=1, vgpus=[], sharing=asked))
        claim = store_claim(kube, asking("asking", "gpu-0", "fixed-share"))
        await call(kubelet, "prepare", claim)
        assert policies(agent) == ["fixed-share", "best-effort"]
        await call(kubelet, "unprepare", claim)
        assert policies(agent) == ["burst-share", "best-effort"]
    finally:
        await agent.stop()
        kubelet.close()


async def test_restarts_after_the_checkpoint_was_lost_keep_the_policy_a_live_claim_asked(
    kube: ApiServerDouble, bus_url: str, tmp_path: Path
) -> None:
    """The first restart rebuilds the checkpoint from the claim's CDI spec, the second
    reads the rebuilt one."""
    kubelet = KubeletDouble()
    first = NodeAgent(settings(bus_url, tmp_path, keep=True))
    await first.start()
    try:
        await call(kubelet, "prepare", store_claim(kube, asking("held", "gpu-0", "fixed-share")))
        saved = node_checkpoint(first.node)
    finally:
        await first.stop()
        kubelet.close()
    saved.write_bytes(b"{lost")
    for keep in (True, False):
        again = NodeAgent(settings(bus_url, tmp_path, keep=keep))
        await again.start()
        try:
            assert policies(again) == ["fixed-share", "best-effort"]
        finally:
            await again.stop()
