"""Memory limits: an atomic check-and-add across every process of a vGPU."""

from __future__ import annotations

import pytest

from qshare_driver import Client, EventKind, Node, OutOfMemoryError
from qshare_driver.errors import InvalidArgumentError

GiB = 1 << 30
MiB = 1 << 20


def test_reservation_over_the_limit_fails_and_reserves_nothing(node: Node) -> None:
    node.create_vgpu(1, 0, "low", 50, GiB)
    with Client.attach(node.name, 1, node.directory) as c:
        c.reserve(GiB - MiB)
        with pytest.raises(OutOfMemoryError, match="vGPU 1"):
            c.reserve(2 * MiB)
        assert node.vgpu_stats(1).mem_used == GiB - MiB
    assert EventKind.OOM in [e.kind for e in node.events(0.1)]


def test_reservations_of_all_processes_count_against_one_limit(node: Node) -> None:
    node.create_vgpu(1, 0, "low", 50, GiB)
    with (
        Client.attach(node.name, 1, node.directory) as a,
        Client.attach(node.name, 1, node.directory) as b,
    ):
        a.reserve(600 * MiB)
        with pytest.raises(OutOfMemoryError):
            b.reserve(600 * MiB)
        b.reserve(424 * MiB)
        assert a.info().mem_used == GiB


def test_detach_returns_the_process_reservations(node: Node) -> None:
    node.create_vgpu(1, 0, "low", 50, GiB)
    c = Client.attach(node.name, 1, node.directory)
    c.reserve(512 * MiB)
    c.detach()
    assert node.vgpu_stats(1).mem_used == 0


def test_releasing_more_than_reserved_is_refused(node: Node) -> None:
    node.create_vgpu(1, 0, "low", 50, GiB)
    with Client.attach(node.name, 1, node.directory) as c:
        c.reserve(MiB)
        with pytest.raises(InvalidArgumentError, match="reserved"):
            c.release(2 * MiB)
        with pytest.raises(ValueError, match="negative"):
            c.release(-1)
        assert c.info().mem_reserved == MiB


def test_lowered_limit_applies_to_the_next_reservation(node: Node) -> None:
    node.create_vgpu(1, 0, "low", 50, 2 * GiB)
    with Client.attach(node.name, 1, node.directory) as c:
        c.reserve(GiB)
        node.update_vgpu(1, 50, GiB + MiB)
        with pytest.raises(OutOfMemoryError):
            c.reserve(2 * MiB)
        node.update_vgpu(1, 50, 2 * GiB)
        c.reserve(GiB)
        assert c.info().mem_limit == 2 * GiB
