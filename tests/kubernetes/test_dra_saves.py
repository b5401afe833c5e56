"""Every checkpoint write of the DRA plugin is a group commit on its server's loop: an
unprepare keeps its releases in memory, and a prepare that read its claims from the API server
(in a thread) its vGPUs, then one flush writes the checkpoint for every claim of the call and
for the other calls of the same turn: once per turn, not once per vGPU or claim."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from qshare_node_agent.kubernetes import checkpoint
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.dra import DraPlugin
from qshare_node_agent.kubernetes.local_vgpus import LocalVgpus

from .conftest import resource_claim, store_claim, wait_for
from .doubles import ApiServerDouble, KubeletDouble


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of entries each checkpoint write named, in order (the writes are real)."""
    named: list[int] = []
    real: Callable[..., None] = checkpoint.save

    def counted(path: Any, segment: str, entries: Any) -> None:
        kept = list(entries)
        named.append(len(kept))
        real(path, segment, kept)

    monkeypatch.setattr(checkpoint, "save", counted)
    return named


def two_card_claim(name: str) -> dict[str, Any]:
    claim = resource_claim(name, {"memory": "2Gi", "cores": "10"}, device="gpu-0")
    results = claim["status"]["allocation"]["devices"]["results"]
    second = copy.deepcopy(results[0])
    second["device"], second["shareID"] = "gpu-1", second["shareID"][:-1] + "f"
    results.append(second)
    return claim


def test_an_unprepare_of_three_claims_of_two_vgpus_each_writes_the_checkpoint_once(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
    writes: list[int],
) -> None:
    """Before: one write per vGPU released, six in all, each an fsync on the DRA server's
    loop while every other call waited, and the first five naming part of a claim."""
    claims = [store_claim(apiserver, two_card_claim(f"pair-{i}")) for i in range(3)]
    for claim in claims:
        wait_for(lambda claim=claim: dra.claims.holds(*claim))
    answer = kubelet.prepare(settings.dra_socket, claims)
    assert [answer.claims[uid].error for _, _, uid in claims] == ["", "", ""]
    assert len(backend.prepared()) == 6
    del writes[:]
    answer = kubelet.unprepare(settings.dra_socket, claims)
    assert [answer.claims[uid].error for _, _, uid in claims] == ["", "", ""]
    assert backend.prepared() == {} and dra.prepared_claims() == set()
    assert writes == [0]
    assert not any(dra.cdi.path(f"claim_{uid}").exists() for _, _, uid in claims)


def test_a_prepare_of_three_claims_read_from_the_api_server_writes_the_checkpoint_once(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    writes: list[int],
) -> None:
    """Before: the thread that read the claims saved each claim itself, three writes, each
    holding the backend's save lock, which a flush on the loop then waited for."""
    claims = [store_claim(apiserver, two_card_claim(f"read-{i}")) for i in range(3)]
    for claim in claims:
        wait_for(lambda claim=claim: dra.claims.holds(*claim))
        dra.claims.forget(claim[2])  # not held: read from the API server, in a thread
    del writes[:]
    answer = kubelet.prepare(settings.dra_socket, claims)
    assert [answer.claims[uid].error for _, _, uid in claims] == ["", "", ""]
    assert writes == [6]
