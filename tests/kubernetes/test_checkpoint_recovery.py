"""A checkpoint that cannot be used does not stop the agent: it is moved aside, counted, and
what it held is rebuilt from the claims' CDI specs and the segment, so prepared claims
(which the kubelet does not prepare again) keep their vGPUs and can still be unprepared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from qshare.contracts.domain import Priority
from qshare_node_agent.kubernetes import cdi, checkpoint
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.dra import DraPlugin
from qshare_node_agent.kubernetes.local_vgpus import FIRST_LOCAL_ID, LocalVgpus

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


def saved_body(backend: LocalVgpus, *entries: dict[str, object]) -> bytes:
    """A checkpoint of `backend`'s segment holding `entries` (each a valid entry but for the
    fields it names)."""
    base = {"key": "dra/u1/gpu/gpu-0/whole", "vgpu_id": FIRST_LOCAL_ID, "card_index": 0,
            "priority": "low", "core_share": 10, "memory_mib": 2048}  # fmt: skip
    body = {"version": 1, "segment": backend._node.name, "entries": [base | e for e in entries]}
    return json.dumps(body).encode()


OUT_OF_RANGE = {
    "negative vGPU id": {"vgpu_id": -1},
    "vGPU id past 32 bits": {"vgpu_id": 1 << 32},
    "memory past 64 bits of bytes": {"memory_mib": 1 << 50},
    "core share over 100": {"core_share": 500},
    "negative card": {"card_index": -1},
}


@pytest.mark.parametrize("entry", OUT_OF_RANGE.values(), ids=OUT_OF_RANGE.keys())
def test_a_checkpoint_naming_what_no_prepare_makes_is_moved_aside(
    backend: LocalVgpus, entry: dict[str, object]
) -> None:
    """JSON of the right shape whose numbers no prepare writes (a foreign or damaged file)
    is unusable like a corrupt one, instead of stopping the agent's start."""
    backend.checkpoint.write_bytes(saved_body(backend, entry))
    assert backend.restore() == []
    assert len(asides(backend.checkpoint)) == 1
    assert backend.prepared() == {}
    assert backend._node.list_vgpus() == []


def test_a_checkpoint_naming_an_allocator_vgpu_never_gives_it_to_a_claim(
    backend: LocalVgpus,
) -> None:
    """Ids below 2^31 are the allocator's: a claim restored onto one would take it over, and
    its unprepare would destroy the allocator's vGPU under its workload."""
    backend._node.create_vgpu(5, 0, "low", 10, 2048 << 20)
    backend.checkpoint.write_bytes(saved_body(backend, {"vgpu_id": 5}))
    assert backend.restore() == []
    assert len(asides(backend.checkpoint)) == 1
    assert backend.prepared() == {}
    assert backend._node.list_vgpus() == [5]


def test_a_checkpoint_naming_one_vgpu_for_two_keys_is_moved_aside(backend: LocalVgpus) -> None:
    """Two claims sharing one vGPU: the first unprepare would destroy the other's."""
    second = {"key": "dra/u2/gpu/gpu-0/whole"}
    backend.checkpoint.write_bytes(saved_body(backend, {}, second))
    assert backend.restore() == []
    assert len(asides(backend.checkpoint)) == 1
    assert backend.prepared() == {}


def test_a_rebuild_skips_a_vgpu_no_prepare_could_have_made(backend: LocalVgpus) -> None:
    """A local vGPU of under 1 MiB (made by something other than a prepare) that a spec
    names is dropped by the rebuild, which goes on for the others."""
    backend._node.create_vgpu(FIRST_LOCAL_ID, 0, "low", 10, 4096)
    backend._node.create_vgpu(FIRST_LOCAL_ID + 1, 0, "low", 10, 2048 << 20)
    backend.checkpoint.write_bytes(b"not json")
    recorded = {
        FIRST_LOCAL_ID: cdi.Recorded("dra/u1/recovered/a"),
        FIRST_LOCAL_ID + 1: cdi.Recorded("dra/u2/recovered/b"),
    }
    assert backend.restore(lambda: recorded) == []
    assert list(backend.prepared()) == ["dra/u2/recovered/b"]
    assert backend._node.list_vgpus() == [FIRST_LOCAL_ID + 1]


def prepared_asking_fixed_share(
    backend: LocalVgpus,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
) -> None:
    """A claim on card 1 asking `fixed-share` prepared (the plugin serving `backend`), then
    its checkpoint corrupted."""
    asking = resource_claim("asking", device="gpu-1", parameters={"policy": "fs"})
    claim = store_claim(apiserver, asking)
    assert kubelet.prepare(settings.dra_socket, [claim]).claims[claim[2]].error == ""
    backend.checkpoint.write_bytes(b"{garbage")


def test_a_checkpoint_rebuilt_from_cdi_specs_records_the_policy_each_claim_asked(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    prepared_asking_fixed_share(backend, kubelet, settings, apiserver)
    restarted = LocalVgpus(backend._node, CARDS)
    assert restarted.restore(lambda: cdi.recorded_vgpus(settings.cdi_dir)) == []
    saved = checkpoint.load(restarted.checkpoint, backend._node.name)
    assert [e.policy for e in saved] == ["fixed-share"]


def test_a_rebuild_gives_a_card_back_the_policy_its_claim_asked(
    dra: DraPlugin,
    kubelet: KubeletDouble,
    settings: KubernetesSettings,
    apiserver: ApiServerDouble,
    backend: LocalVgpus,
) -> None:
    """The restart's adoption of the segment read no usable checkpoint, so it gave the card
    the agent's policy; the rebuild puts the claim's back."""
    prepared_asking_fixed_share(backend, kubelet, settings, apiserver)
    backend._node.set_policy(1, "best-effort")  # as the adoption does
    restarted = LocalVgpus(backend._node, CARDS)
    assert restarted.restore(lambda: cdi.recorded_vgpus(settings.cdi_dir)) == []
    assert restarted.cards()[1].policy == "fixed-share"


def test_a_spec_whose_environment_is_not_text_is_skipped_by_the_rebuild(
    settings: KubernetesSettings,
) -> None:
    settings.cdi_dir.mkdir()
    device = {"name": "a", "containerEdits": {"env": [2147483648]}}
    (settings.cdi_dir / "qshare.io-claim_u1.json").write_text(json.dumps({"devices": [device]}))
    assert cdi.recorded_vgpus(settings.cdi_dir) == {}
