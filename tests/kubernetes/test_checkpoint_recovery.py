"""A checkpoint that cannot be used does not stop the agent: it is moved aside, counted, and
what it held is rebuilt from the claims' CDI specs and the segment, so prepared claims
(which the kubelet does not prepare again) keep their vGPUs and can still be unprepared."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from qshare.contracts.domain import Priority
from qshare_node_agent.kubernetes import cdi, checkpoint
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.dra import DraPlugin
from qshare_node_agent.kubernetes.local_vgpus import LocalVgpus

from .conftest import CARDS, resource_claim, store_claim, wait_for
from .doubles import ApiServerDouble, KubeletDouble

CORRUPT = {
    "truncated": b'{"version": 1, "segment": "x", "entr',
    "not JSON": b"\x00\xffnot json at all",
    "wrong shape": b'[{"key": "dra/x"}]',
    "another segment": b'{"version": 1, "segment": "someone-else", "entries": []}',
}


def set_aside_count(backend: LocalVgpus) -> float:
    labels = {"node": backend._node.name}
    return REGISTRY.get_sample_value("qshare_node_checkpoints_set_aside_total", labels) or 0.0


def asides(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}.corrupt-*"))


@pytest.mark.parametrize("body", CORRUPT.values(), ids=CORRUPT.keys())
def test_an_unusable_checkpoint_is_moved_aside_counted_and_replaced(
    backend: LocalVgpus, body: bytes
) -> None:
    backend.checkpoint.write_bytes(body)
    before = set_aside_count(backend)
    assert backend.restore() == []
    [aside] = asides(backend.checkpoint)
    assert aside.read_bytes() == body
    assert set_aside_count(backend) == before + 1
    assert checkpoint.load(backend.checkpoint, backend._node.name) == []


def test_an_unreadable_checkpoint_is_moved_aside(backend: LocalVgpus) -> None:
    backend.checkpoint.mkdir()  # reading it fails with EISDIR
    assert backend.restore() == []
    assert len(asides(backend.checkpoint)) == 1
    assert backend.checkpoint.is_file()


def test_a_prepared_claim_survives_a_corrupt_checkpoint_and_can_be_unprepared(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    claim = store_claim(apiserver, resource_claim("kept"))
    wait_for(lambda: dra.claims.holds(*claim))
    assert kubelet.prepare(settings.dra_socket, [claim]).claims[claim[2]].error == ""
    ids = {v.vgpu_id for v in backend.prepared().values()}
    backend.checkpoint.write_bytes(b"{garbage")

    restarted = LocalVgpus(backend._node, CARDS)
    assert restarted.restore(lambda: cdi.recorded_vgpus(settings.cdi_dir)) == []
    assert {v.vgpu_id for v in restarted.prepared().values()} == ids
    assert all(k.startswith(f"dra/{claim[2]}/") for k in restarted.prepared())
    assert set(backend._node.list_vgpus()) == ids
    saved = checkpoint.load(restarted.checkpoint, backend._node.name)
    assert {e.vgpu_id for e in saved} == ids

    dra.backend = restarted  # the restarted agent's plugin
    assert kubelet.unprepare(settings.dra_socket, [claim]).claims[claim[2]].error == ""
    assert backend._node.list_vgpus() == []
    assert restarted.prepared() == {}


def test_a_local_vgpu_no_spec_names_is_dropped_after_a_corrupt_checkpoint(
    backend: LocalVgpus, settings: KubernetesSettings
) -> None:
    backend.prepare("dra/u1/r/gpu-0/0", 0, Priority.LOW, 10, 2048)
    backend.checkpoint.write_bytes(b"not json")
    restarted = LocalVgpus(backend._node, CARDS)
    assert restarted.restore(lambda: cdi.recorded_vgpus(settings.cdi_dir)) == []
    assert backend._node.list_vgpus() == []
