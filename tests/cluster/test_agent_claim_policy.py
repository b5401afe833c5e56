"""A DRA claim's card policy lasts as long as the claim: a card a prepared claim asked a
policy of keeps it when the restarted agent adopts the segment, while a card no claim holds
takes the agent's settings again, as it does once the last claim asking one is unprepared
(or the sharing the control plane asked of it, when it asked some). The Node's label
`qshare.io/policy` takes the place of the agent's setting, below both."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
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

from .test_agent_kubernetes import NODE, kube, published
from .test_node_commands import apply

__all__ = ["kube"]  # the API server double and the plugins' settings, as a fixture


def settings(bus_url: str, shm_dir: Path, keep: bool) -> NodeAgentSettings:
    return NodeAgentSettings(
        name=NODE, nats_url=bus_url, simulate="2:16Gi", shm_dir=shm_dir, heartbeat_s=0.5,
        kubernetes=True, policy=CardPolicy.BEST_EFFORT, keep_segment_on_stop=keep,
    )  # fmt: skip


@contextlib.asynccontextmanager
async def running(bus_url: str, shm_dir: Path, keep: bool) -> AsyncIterator[NodeAgent]:
    """A started agent on the simulated node, stopped after the block."""
    agent = NodeAgent(settings(bus_url, shm_dir, keep))
    await agent.start()
    try:
        yield agent
    finally:
        await agent.stop()


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
    with contextlib.closing(KubeletDouble()) as kubelet:
        async with running(bus_url, tmp_path, keep=True):
            held = store_claim(kube, asking("held", "gpu-0", "fixed-share"))
            gone = store_claim(kube, asking("gone", "gpu-1", "burst-share"))
            for claim in (held, gone):
                await call(kubelet, "prepare", claim)
            await call(kubelet, "unprepare", gone)
    async with running(bus_url, tmp_path, keep=False) as second:
        assert policies(second) == ["fixed-share", "best-effort"]


async def test_a_card_takes_the_agents_policy_back_once_no_prepared_claim_asks_one(
    kube: ApiServerDouble, bus_url: str, tmp_path: Path
) -> None:
    with contextlib.closing(KubeletDouble()) as kubelet:
        async with running(bus_url, tmp_path, keep=False) as agent:
            first = store_claim(kube, asking("first", "gpu-0", "fixed-share"))
            second = store_claim(kube, asking("second", "gpu-0", "fixed-share"))
            for claim in (first, second):
                await call(kubelet, "prepare", claim)
            await call(kubelet, "unprepare", first)
            assert policies(agent) == ["fixed-share", "best-effort"]  # the second still asks it
            await call(kubelet, "unprepare", second)
            assert policies(agent) == ["best-effort", "best-effort"]


async def test_a_card_takes_back_the_sharing_asked_of_it_once_no_prepared_claim_asks_a_policy(
    kube: ApiServerDouble, bus_url: str, nc: Nats, tmp_path: Path
) -> None:
    with contextlib.closing(KubeletDouble()) as kubelet:
        async with running(bus_url, tmp_path, keep=False) as agent:
            burst = SharingSettings(policy=CardPolicy.BURST_SHARE)
            asked = [WantedSharing(gpu=agent.cards[0].uuid, settings=burst)]
            await apply(nc, NODE, ApplyDesired(node=NODE, generation=1, vgpus=[], sharing=asked))
            claim = store_claim(kube, asking("asking", "gpu-0", "fixed-share"))
            await call(kubelet, "prepare", claim)
            assert policies(agent) == ["fixed-share", "best-effort"]
            await call(kubelet, "unprepare", claim)
            assert policies(agent) == ["burst-share", "best-effort"]


async def test_restarts_after_the_checkpoint_was_lost_keep_the_policy_a_live_claim_asked(
    kube: ApiServerDouble, bus_url: str, tmp_path: Path
) -> None:
    """The first restart rebuilds the checkpoint from the claim's CDI spec, the second
    reads the rebuilt one."""
    with contextlib.closing(KubeletDouble()) as kubelet:
        async with running(bus_url, tmp_path, keep=True) as first:
            await call(
                kubelet, "prepare", store_claim(kube, asking("held", "gpu-0", "fixed-share"))
            )
            saved = node_checkpoint(first.node)
    saved.write_bytes(b"{lost")
    for keep in (True, False):
        async with running(bus_url, tmp_path, keep=keep) as again:
            assert policies(again) == ["fixed-share", "best-effort"]


def label_node(kube: ApiServerDouble, policy: str | None) -> None:
    """The agent's Node object, labelled `qshare.io/policy: policy` (no label: None)."""
    labels = {} if policy is None else {"qshare.io/policy": policy}
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": labels}}
    kube.put_object(f"/api/v1/nodes/{NODE}", node)


async def test_the_node_label_gives_the_cards_their_policy_in_place_of_the_agents(
    kube: ApiServerDouble, bus_url: str, tmp_path: Path
) -> None:
    label_node(kube, "burst-share")
    async with running(bus_url, tmp_path, keep=False) as agent:
        assert policies(agent) == ["burst-share", "burst-share"]


async def test_the_agent_registers_the_node_labels_policy(
    kube: ApiServerDouble, bus_url: str, tmp_path: Path
) -> None:
    label_node(kube, "fs")
    async with running(bus_url, tmp_path, keep=False) as agent:
        assert agent.registration().labels["qshare.io/policy"] == "fixed-share"


async def test_a_changed_node_label_is_taken_and_published_within_a_heartbeat(
    kube: ApiServerDouble, bus_url: str, tmp_path: Path
) -> None:
    async with running(bus_url, tmp_path, keep=False) as agent:
        label_node(kube, "bs")
        both = {"gpu-0": "burst-share", "gpu-1": "burst-share"}
        await until(lambda: published(kube, "policy") == both)
        assert policies(agent) == ["burst-share", "burst-share"]


async def test_a_live_claims_policy_wins_over_the_node_label_until_it_is_unprepared(
    kube: ApiServerDouble, bus_url: str, tmp_path: Path
) -> None:
    with contextlib.closing(KubeletDouble()) as kubelet:
        async with running(bus_url, tmp_path, keep=False) as agent:
            claim = store_claim(kube, asking("asking", "gpu-0", "fixed-share"))
            await call(kubelet, "prepare", claim)
            label_node(kube, "burst-share")
            await until(lambda: policies(agent) == ["fixed-share", "burst-share"])
            await call(kubelet, "unprepare", claim)
            assert policies(agent) == ["burst-share", "burst-share"]


async def test_the_sharing_asked_over_rest_wins_over_the_node_label(
    kube: ApiServerDouble, bus_url: str, nc: Nats, tmp_path: Path
) -> None:
    async with running(bus_url, tmp_path, keep=False) as agent:
        fixed = SharingSettings(policy=CardPolicy.FIXED_SHARE)
        asked = [WantedSharing(gpu=agent.cards[0].uuid, settings=fixed)]
        await apply(nc, NODE, ApplyDesired(node=NODE, generation=1, vgpus=[], sharing=asked))
        label_node(kube, "burst-share")
        await until(lambda: policies(agent) == ["fixed-share", "burst-share"])


async def test_an_invalid_node_label_is_logged_once_and_ignored(
    kube: ApiServerDouble, bus_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    label_node(kube, "fastest")
    async with running(bus_url, tmp_path, keep=False) as agent:
        await asyncio.sleep(1.6)  # three heartbeat periods more
        assert policies(agent) == ["best-effort", "best-effort"]
        logged = [r.getMessage() for r in caplog.records if "'fastest'" in r.getMessage()]
        assert len(logged) == 1 and "qshare.io/policy" in logged[0]


async def until(check: Callable[[], bool], within_s: float = 20.0) -> None:
    """Wait until `check()` holds (the bound only stops a broken test)."""
    async with asyncio.timeout(within_s):
        while not check():
            await asyncio.sleep(0.05)
