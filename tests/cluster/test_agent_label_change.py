"""A node's labels in the control plane follow the agent's: a label that changes while the
agent runs (the card policy it takes from the Node's `qshare.io/policy` in Kubernetes, or a
Node label named in QSHARE_K8S_NODE_LABELS) is registered again within a heartbeat, so a
claim selecting the node by it is placed; labels set in QSHARE_NODE_LABELS are read at
start, and a restarted agent's registration replaces the old ones (a label taken out goes).
Against the real allocator, Postgres and NATS."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from qshare.contracts.domain import POLICY_LABEL, CardPolicy
from qshare.testing.kube_apiserver import ApiServerDouble
from qshare_node_agent.app import NodeAgent
from qshare_node_agent.settings import NodeAgentSettings

from .conftest import claim_until, create_claim, eventually
from .test_agent_claim_policy import label_node, running
from .test_agent_kubernetes import NODE, kube

__all__ = ["kube"]  # the API server double and the plugins' settings, as a fixture


async def registered_labels(api: httpx.AsyncClient, node: str) -> dict[str, Any]:
    found = await api.get(f"/v1/nodes/{node}")
    return dict(found.json()["labels"]) if found.status_code == 200 else {}


async def counted_relabels(agent: NodeAgent, times: int) -> None:
    """Wait for the agent to count its `times`th registration again: the allocator commits
    before it answers, so REST can show the new labels before the agent has read the answer."""

    async def counted() -> bool:
        return agent.relabels >= times

    await eventually(counted, 10)


async def test_a_policy_taken_from_the_node_label_is_registered_and_places_claims(
    kube: ApiServerDouble, bus_url: str, tmp_path: Path, api: httpx.AsyncClient
) -> None:
    """Before, the registration kept the policy the agent had at start: the control plane
    went on saying best-effort, and a claim selecting the node's new policy stayed pending."""
    async with running(bus_url, tmp_path, keep=False) as agent:
        await asyncio.wait_for(agent.registered.wait(), 20)
        assert (await registered_labels(api, NODE))[POLICY_LABEL] == "best-effort"
        claim = await create_claim(api, node_selector={POLICY_LABEL: "burst-share"})
        label_node(kube, "burst-share")

        async def relabelled() -> bool:
            return (await registered_labels(api, NODE)).get(POLICY_LABEL) == "burst-share"

        await eventually(relabelled, 10)
        placed = await claim_until(api, claim["id"], "ready")
        assert placed["node"] == NODE
        await counted_relabels(agent, 1)
        assert agent.relabels == 1


async def test_a_registration_says_the_generation_the_agent_applied(
    kube: ApiServerDouble, bus_url: str, tmp_path: Path, api: httpx.AsyncClient
) -> None:
    """What lets the allocator keep the generation it confirmed of a running agent that
    registers again (tests/controlplane/test_reregistration_generation.py)."""
    async with running(bus_url, tmp_path, keep=False) as agent:
        await asyncio.wait_for(agent.registered.wait(), 20)
        claim = await create_claim(api)
        await claim_until(api, claim["id"], "ready")
        assert agent.registration().applied_generation >= 1  # the apply that placed it


async def test_unchanged_labels_are_not_registered_again(
    kube: ApiServerDouble, bus_url: str, tmp_path: Path, api: httpx.AsyncClient
) -> None:
    """Guard: a heartbeat is a heartbeat while the labels stay as registered."""
    async with running(bus_url, tmp_path, keep=False) as agent:
        await asyncio.wait_for(agent.registered.wait(), 20)
        await asyncio.sleep(1.6)  # three heartbeat periods
        assert agent.relabels == 0


async def test_a_restarted_agents_labels_replace_those_it_registered_before(
    bus_url: str, tmp_path: Path, api: httpx.AsyncClient
) -> None:
    """Guard: QSHARE_NODE_LABELS is read at start; a label taken out of it goes with the
    restart's registration, a new one comes."""
    for labels, gone in (({"zone": "a", "team": "x"}, None), ({"zone": "b"}, "team")):
        settings = NodeAgentSettings(
            name="relabelled", nats_url=bus_url, simulate="1:8Gi", shm_dir=tmp_path,
            heartbeat_s=0.5, labels=labels, policy=CardPolicy.BEST_EFFORT,
        )  # fmt: skip
        agent = NodeAgent(settings)
        await agent.start()
        try:
            await asyncio.wait_for(agent.registered.wait(), 20)
            found = await registered_labels(api, "relabelled")
            assert {k: found.get(k) for k in labels} == labels
            assert gone is None or gone not in found
        finally:
            await agent.stop()


def node_with_labels(kube: ApiServerDouble, labels: dict[str, str]) -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": labels}}
    kube.put_object(f"/api/v1/nodes/{NODE}", node)


async def test_the_node_labels_named_in_the_settings_are_registered_and_followed(
    kube: ApiServerDouble,
    bus_url: str,
    tmp_path: Path,
    api: httpx.AsyncClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """QSHARE_K8S_NODE_LABELS names labels of the Kubernetes Node (where a platform team sets
    them: a DaemonSet's environment is the same on every node): the registration carries
    those the Node has, and follows them as they are set, changed and taken off. Other labels
    of the Node stay out."""
    zone = "topology.kubernetes.io/zone"
    monkeypatch.setenv("QSHARE_K8S_NODE_LABELS", json.dumps(["pool", zone]))
    node_with_labels(kube, {"pool": "training", "team": "ml"})
    async with running(bus_url, tmp_path, keep=False) as agent:
        await asyncio.wait_for(agent.registered.wait(), 20)
        found = await registered_labels(api, NODE)
        assert (found["pool"], zone in found, "team" in found) == ("training", False, False)
        for times, labels in enumerate(({"pool": "inference", zone: "a"}, {zone: "b"}), 1):
            node_with_labels(kube, labels)

            async def registered(labels: dict[str, str] = labels) -> bool:
                found = await registered_labels(api, NODE)
                return {k: found[k] for k in ("pool", zone) if k in found} == labels

            await eventually(registered, 10)
            await counted_relabels(agent, times)
        assert agent.relabels == 2
