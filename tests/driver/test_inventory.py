"""The vGPU inventory: limits change at run time, bad input is refused with a clear
error and changes nothing, and a destroyed vGPU stops its contexts cleanly."""

from __future__ import annotations

import pytest

from qshare_driver import (
    AlreadyExistsError,
    Client,
    DestroyedError,
    InvalidArgumentError,
    Node,
    NotFoundError,
    ShareSumError,
)

GiB = 1 << 30


@pytest.mark.parametrize("share", [0, 101])
def test_core_share_outside_1_to_100_is_refused(node: Node, share: int) -> None:
    with pytest.raises(InvalidArgumentError, match="core share"):
        node.create_vgpu(1, 0, "low", share, GiB)
    assert node.card_stats(0).vgpus == 0


@pytest.mark.parametrize("limit", [0, 17 * GiB])
def test_memory_limit_of_zero_or_above_the_card_is_refused(node: Node, limit: int) -> None:
    with pytest.raises(InvalidArgumentError, match="memory limit"):
        node.create_vgpu(1, 0, "low", 10, limit)


def test_unknown_card_and_vgpu_ids_are_named(node: Node) -> None:
    with pytest.raises(NotFoundError, match="card with index 5"):
        node.create_vgpu(1, 5, "low", 10, GiB)
    with pytest.raises(NotFoundError, match="vGPU with id 9"):
        node.update_vgpu(9, 10, GiB)
    with pytest.raises(NotFoundError, match="vGPU with id 9"):
        Client.attach(node.name, 9, node.directory)


def test_duplicate_vgpu_id_is_refused(node: Node) -> None:
    node.create_vgpu(1, 0, "low", 10, GiB)
    with pytest.raises(AlreadyExistsError, match="1 already exists"):
        node.create_vgpu(1, 0, "high", 10, GiB)


def test_shares_over_100_per_priority_on_a_card_are_refused(node: Node) -> None:
    node.create_vgpu(1, 0, "low", 70, GiB)
    node.create_vgpu(2, 0, "high", 70, GiB)
    with pytest.raises(ShareSumError, match="sum to 101"):
        node.create_vgpu(3, 0, "low", 31, GiB)


def test_segment_name_with_a_slash_or_too_long_is_refused(shm_dir: str) -> None:
    with pytest.raises(InvalidArgumentError, match="'/'"):
        Node.create("a/b", shm_dir)
    with pytest.raises(InvalidArgumentError, match="at most 47"):
        Node.create("x" * 60, shm_dir)


def test_second_owner_of_a_live_segment_is_refused(node: Node) -> None:
    with pytest.raises(AlreadyExistsError):
        Node.create(node.name, node.directory)


def test_attach_without_a_segment_names_the_path(shm_dir: str) -> None:
    with pytest.raises(NotFoundError, match="no segment at"):
        Client.attach("absent", 1, shm_dir)


def test_limits_updated_while_a_context_runs_take_effect(node: Node) -> None:
    node.create_vgpu(1, 0, "low", 10, GiB)
    with Client.attach(node.name, 1, node.directory) as c:
        c.run_kernel(0.0001)
        node.update_vgpu(1, 40, 2 * GiB)
        info = c.info()
        assert (info.core_share, info.mem_limit) == (40, 2 * GiB)
        c.run_kernel(0.0001)


def test_destroyed_vgpu_refuses_its_attached_context(node: Node) -> None:
    node.create_vgpu(1, 0, "low", 10, GiB)
    c = Client.attach(node.name, 1, node.directory)
    node.destroy_vgpu(1)
    with pytest.raises(DestroyedError, match="destroyed"):
        c.launch_begin()
    with pytest.raises(NotFoundError):
        Client.attach(node.name, 1, node.directory)
    c.detach()
    node.create_vgpu(1, 0, "low", 10, GiB)


def test_a_simulated_kernel_counts_one_launch(node: Node) -> None:
    node.create_vgpu(1, 0, "low", 50, GiB)
    with Client.attach(node.name, 1, node.directory) as c:
        c.run_kernel(0.0001)
        assert node.vgpu_stats(1).launches == 1
