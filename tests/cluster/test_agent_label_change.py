"""A node's labels in the control plane follow the agent's: a label the agent derives while it
runs (the card policy it takes from the Node's `qshare.io/policy` in Kubernetes) is
registered again within a heartbeat, so a claim selecting the node by it is placed; labels
set in QSHARE_NODE_LABELS are read at start, and a restarted agent's registration replaces
the old ones (a label taken out goes). Against the real allocator, Postgres and NATS."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

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
        assert agent.relabels == 1


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
