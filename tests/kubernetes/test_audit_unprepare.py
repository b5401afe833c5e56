"""An unprepare the driver refuses leaves the claim prepared, with an error for that claim:
the kubelet asks again, and the retry destroys the vGPU. Nothing is forgotten while the
segment still holds it (a vGPU counted against its card that no claim names any more), and
the checkpoint names exactly what is still prepared when one of a claim's vGPUs goes and
another stays, so a restarted agent neither makes the gone one again nor loses the other."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from qshare.testing.failing_node import FailingNode
from qshare_driver.node import Node
from qshare_node_agent.kubernetes import cdi, checkpoint
from qshare_node_agent.kubernetes.apiserver import KubeApi
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.dra import DraPlugin
from qshare_node_agent.kubernetes.local_vgpus import FIRST_LOCAL_ID, LocalVgpus, node_checkpoint

from .conftest import CARDS, resource_claim, store_claim, validate_cdi
from .doubles import ApiServerDouble, KubeletDouble
from .test_dra_saves import two_card_claim


@pytest.fixture
def flaky(node: Node) -> FailingNode:
    return FailingNode(node, "destroy_vgpu", why="the segment's lock failed")


@pytest.fixture
def plugin(
    settings: KubernetesSettings, flaky: FailingNode, kube_api: KubeApi
) -> Iterator[DraPlugin]:
    backend = LocalVgpus(flaky, CARDS, min_vgpu_mib=1024)  # type: ignore[arg-type]
    dra = DraPlugin(settings, backend, kube_api)
    dra.start()
    yield dra
    dra.stop()


def local_vgpus(node: Node) -> list[int]:
    return [i for i in node.list_vgpus() if i >= FIRST_LOCAL_ID]


def test_a_refused_unprepare_keeps_the_claim_and_its_retry_destroys_the_vgpu(
    plugin: DraPlugin,
    flaky: FailingNode,
    node: Node,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
) -> None:
    claim = store_claim(apiserver, resource_claim("stuck"))
    assert kubelet.prepare(settings.dra_socket, [claim]).claims[claim[2]].error == ""
    flaky.failures = 1
    refused = kubelet.unprepare(settings.dra_socket, [claim]).claims[claim[2]].error
    assert "lock failed" in refused
    assert len(local_vgpus(node)) == 1 and plugin.prepared_claims() == {claim[2]}
    assert kubelet.unprepare(settings.dra_socket, [claim]).claims[claim[2]].error == ""
    assert local_vgpus(node) == [] and plugin.prepared_claims() == set()


def saved_keys(node: Node) -> set[str]:
    return {e.key for e in checkpoint.load(node_checkpoint(node), node.name)}


def test_a_claim_half_unprepared_is_saved_as_what_stays_and_a_restart_finishes_it(
    plugin: DraPlugin,
    flaky: FailingNode,
    node: Node,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    kube_api: KubeApi,
) -> None:
    """Before: the vGPU destroyed first left memory but not the checkpoint (no save followed
    a refused claim), so an agent restarted then made it again from the checkpoint."""
    claim = store_claim(apiserver, two_card_claim("halved"))
    assert kubelet.prepare(settings.dra_socket, [claim]).claims[claim[2]].error == ""
    assert len(local_vgpus(node)) == 2
    flaky.passes, flaky.failures = 1, 1  # the first destroy goes through, the second not
    refused = kubelet.unprepare(settings.dra_socket, [claim]).claims[claim[2]].error
    assert "lock failed" in refused
    [stays] = plugin.backend.prepared()
    assert saved_keys(node) == {stays}
    assert len(local_vgpus(node)) == 1
    spec = json.loads(plugin.cdi.path(f"claim_{claim[2]}").read_text())  # still prepared
    kept = plugin.backend.prepared()[stays]
    assert [d["name"] for d in spec["devices"]] == [cdi.device_name(stays)]  # what stays only
    assert f"QSHARE_VGPU={kept.vgpu_id}" in spec["devices"][0]["containerEdits"]["env"]
    validate_cdi(spec)
    plugin.stop()

    restarted = LocalVgpus(node, CARDS, min_vgpu_mib=1024)  # the agent, started again
    assert restarted.restore() == []
    assert list(restarted.prepared()) == [stays] and len(local_vgpus(node)) == 1
    again = DraPlugin(settings, restarted, kube_api)
    again.start()
    try:
        assert kubelet.unprepare(settings.dra_socket, [claim]).claims[claim[2]].error == ""
    finally:
        again.stop()
    assert local_vgpus(node) == [] and saved_keys(node) == set()
    assert not again.cdi.path(f"claim_{claim[2]}").exists()
