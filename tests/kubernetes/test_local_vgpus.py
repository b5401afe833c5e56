"""LocalVgpus: the backend the plugins drive, over the agent's own driver segment."""

from __future__ import annotations

from pathlib import Path

import pytest

from qshare.contracts.domain import Priority
from qshare_node_agent.kubernetes import checkpoint
from qshare_node_agent.kubernetes.backend import BackendError
from qshare_node_agent.kubernetes.checkpoint import CheckpointError, checkpoint_path, load
from qshare_node_agent.kubernetes.local_vgpus import FIRST_LOCAL_ID, LocalVgpus

from .conftest import CARDS, make_node

LOW, HIGH = Priority.LOW, Priority.HIGH


def test_local_vgpus_take_ids_above_the_allocators_range(backend: LocalVgpus) -> None:
    ids = [backend.prepare(f"k{i}", 0, LOW, 10, 1024).vgpu_id for i in range(3)]
    assert ids == [FIRST_LOCAL_ID, FIRST_LOCAL_ID + 1, FIRST_LOCAL_ID + 2]


def test_the_vgpu_carries_the_environment_the_launcher_sets(backend: LocalVgpus) -> None:
    vgpu = backend.prepare("k", 1, HIGH, 50, 2048)
    assert vgpu.env["QSHARE_VGPU"] == str(vgpu.vgpu_id)
    assert vgpu.env["QSHARE_SEGMENT"] == backend._node.name
    assert vgpu.env["QSHARE_SHM_DIR"] == str(backend.segment_dir)
    assert vgpu.env["QSHARE_VISIBLE_1"] == CARDS[1].uuid  # card 1's index and uuid
    assert "CUDA_VISIBLE_DEVICES" not in vgpu.env  # the interposer sets it (several claims)
    assert vgpu.env["LD_PRELOAD"].endswith("libqshare-cuda.so")


def test_preparing_a_key_again_with_another_shape_is_refused(backend: LocalVgpus) -> None:
    backend.prepare("k", 0, LOW, 10, 1024)
    with pytest.raises(BackendError, match="cannot change shape"):
        backend.prepare("k", 0, LOW, 20, 1024)


def test_an_unhealthy_card_takes_no_new_vgpu(backend: LocalVgpus) -> None:
    backend.set_health(0, False)
    with pytest.raises(BackendError, match=r"card 0 .* is unhealthy"):
        backend.prepare("k", 0, LOW, 10, 1024)


def test_the_drivers_refusal_is_a_backend_error_and_nothing_is_kept(backend: LocalVgpus) -> None:
    backend.prepare("a", 0, LOW, 60, 1024)
    with pytest.raises(BackendError, match="low-priority core shares would sum to 120"):
        backend.prepare("b", 0, LOW, 60, 1024)
    assert list(backend.prepared()) == ["a"]


def test_a_checkpoint_of_another_segment_is_not_used(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with make_node(short_dir, "seg-one") as node:
        LocalVgpus(node, CARDS).prepare("k", 0, LOW, 10, 1024)
    checkpoint_path(short_dir, "seg-one").rename(checkpoint_path(short_dir, "seg-two"))
    with pytest.raises(CheckpointError, match="seg-one"):
        load(checkpoint_path(short_dir, "seg-two"), "seg-two")
    with make_node(short_dir, "seg-two") as node:
        backend = LocalVgpus(node, CARDS)
        assert backend.restore() == []
        assert backend.prepared() == {}
    assert "'seg-one'" in caplog.text


def test_a_corrupt_checkpoint_is_logged_with_its_path_and_what_is_wrong(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = checkpoint_path(short_dir, "seg")
    path.write_text("{not json")
    with make_node(short_dir, "seg") as node:
        LocalVgpus(node, CARDS).restore()
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert f"checkpoint {path} is corrupt" in record.getMessage()
    assert f"moved to {path}.corrupt-" in record.getMessage()


def test_restore_keeps_vgpus_the_segment_still_has(short_dir: Path) -> None:
    with make_node(short_dir, "kept") as node:
        first = LocalVgpus(node, CARDS)
        vgpu = first.prepare("k", 1, HIGH, 30, 3072)
        again = LocalVgpus(node, CARDS)  # the agent restarted, the segment survived
        assert again.restore() == []
        assert again.prepared()["k"].vgpu_id == vgpu.vgpu_id
        assert node.vgpu_stats(vgpu.vgpu_id).mem_limit == 3072 << 20


def saved_keys(backend: LocalVgpus) -> set[str]:
    """The keys in the checkpoint on disk now."""
    return {e.key for e in checkpoint.load(backend.checkpoint, backend._node.name)}


def test_a_prepare_is_on_disk_when_it_returns(backend: LocalVgpus) -> None:
    backend.prepare("k", 0, LOW, 10, 1024)
    assert saved_keys(backend) == {"k"}


def test_a_prepare_not_durable_reaches_the_disk_with_the_next_save(backend: LocalVgpus) -> None:
    backend.prepare("a", 0, LOW, 10, 1024, durable=False)
    backend.prepare("b", 1, LOW, 10, 1024, durable=False)
    assert saved_keys(backend) == set()
    backend.save()
    assert saved_keys(backend) == {"a", "b"}


def test_preparing_a_key_made_but_not_saved_yet_saves_it(backend: LocalVgpus) -> None:
    first = backend.prepare("k", 0, LOW, 10, 1024, durable=False)
    assert backend.prepare("k", 0, LOW, 10, 1024) == first
    assert saved_keys(backend) == {"k"}


def test_restore_destroys_a_local_vgpu_that_was_never_saved(short_dir: Path) -> None:
    with make_node(short_dir, "unsaved") as node:
        crashed = LocalVgpus(node, CARDS)
        kept = crashed.prepare("kept", 0, LOW, 10, 1024)
        lost = crashed.prepare("lost", 0, LOW, 10, 1024, durable=False)  # then a crash
        again = LocalVgpus(node, CARDS)
        assert again.restore() == []
        assert node.list_vgpus() == [kept.vgpu_id]
        assert again.prepare("lost", 0, LOW, 10, 1024).vgpu_id == lost.vgpu_id


def test_a_checkpoint_of_many_entries_loads_back_every_field(backend: LocalVgpus) -> None:
    made = [
        backend.prepare(f"k{i}", i % 2, (LOW, HIGH)[i // 2 % 2], 5 + i, 1024 + i) for i in range(6)
    ]
    entries = checkpoint.load(backend.checkpoint, backend._node.name)
    assert [(e.key, e.vgpu_id, e.card_index, e.priority, e.core_share, e.memory_mib)
            for e in entries] == [(v.key, v.vgpu_id, v.card_index, v.priority, v.core_share,
                                   v.memory_mib) for v in made]  # fmt: skip
