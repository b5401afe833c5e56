"""The DRA plugin refuses claim references (namespace, name, uid) that no Kubernetes object
carries, before they can reach another claim's vGPUs, its CDI spec or another API path."""

from __future__ import annotations

import pytest

from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.dra import DraPlugin
from qshare_node_agent.kubernetes.local_vgpus import LocalVgpus

from .conftest import resource_claim, store_claim
from .doubles import ApiServerDouble, KubeletDouble


def prepared(
    kubelet: KubeletDouble, settings: KubernetesSettings, apiserver: ApiServerDouble
) -> tuple[str, str, str]:
    claim = store_claim(apiserver, resource_claim("kept"))
    answer = kubelet.prepare(settings.dra_socket, [claim]).claims[claim[2]]
    assert answer.error == ""
    return claim


@pytest.mark.parametrize("suffix", ["/gpu", "!", "-"])
def test_unpreparing_a_malformed_uid_leaves_the_claim_it_resembles_whole(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
    suffix: str,
) -> None:
    namespace, name, uid = prepared(kubelet, settings, apiserver)
    before = backend.prepared()
    bogus = uid + suffix
    reply = kubelet.unprepare(settings.dra_socket, [(namespace, name, bogus)])
    assert "uid" in reply.claims[bogus].error
    assert backend.prepared() == before
    assert dra.cdi.path(f"claim_{uid}").exists()


@pytest.mark.parametrize(
    ("namespace", "name"),
    [("default", "a/../../b"), ("x/y", "claim"), ("default", "claim?watch=true"), ("", "c")],
)
def test_a_prepare_naming_a_malformed_claim_is_refused_naming_what_is_wrong(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    namespace: str,
    name: str,
) -> None:
    uid = "0b5e8c1a-1111-4222-8333-444455556666"
    reply = kubelet.prepare(settings.dra_socket, [(namespace, name, uid)])
    error = reply.claims[uid].error
    assert "not a valid" in error, error
