"""An unprepare the driver refuses leaves the claim prepared, with an error for that claim:
the kubelet asks again, and the retry destroys the vGPU. Nothing is forgotten while the
segment still holds it (a vGPU counted against its card that no claim names any more)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from qshare.testing.failing_node import FailingNode
from qshare_driver.node import Node
from qshare_node_agent.kubernetes.apiserver import KubeApi
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.dra import DraPlugin
from qshare_node_agent.kubernetes.local_vgpus import FIRST_LOCAL_ID, LocalVgpus

from .conftest import CARDS, resource_claim, store_claim
from .doubles import ApiServerDouble, KubeletDouble


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
