"""Bad input to policies and release modes is refused with a clear error."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from qshare_driver import InvalidArgumentError, Node, NotFoundError, ShareSumError


@pytest.fixture
def node(shm_dir: str) -> Iterator[Node]:
    with Node.create(f"p{uuid.uuid4().hex[:8]}", shm_dir) as n:
        n.add_card(0, "GPU-sim-0", 16 << 30)
        yield n


def test_an_unknown_policy_name_is_refused(node: Node) -> None:
    with pytest.raises(ValueError, match="unknown policy 'fair'"):
        node.set_policy(0, "fair")


def test_an_unknown_policy_number_is_refused_by_the_driver(node: Node) -> None:
    with pytest.raises(InvalidArgumentError, match="policy 7"):
        node.set_policy(0, 7)  # type: ignore[arg-type]


def test_policy_abbreviations_are_accepted(node: Node) -> None:
    node.set_policy(0, "bs")
    assert node.card_stats(0).policy.name == "BURST_SHARE"


def test_guaranteed_shares_over_100_are_refused_at_vgpu_creation(node: Node) -> None:
    node.create_vgpu(1, 0, "low", 60, 1 << 30)
    with pytest.raises(ShareSumError, match=r"sum to 110 \(> 100\)"):
        node.create_vgpu(2, 0, "low", 50, 1 << 30)


def test_high_priority_shares_do_not_count_against_low_priority(node: Node) -> None:
    node.create_vgpu(1, 0, "low", 60, 1 << 30)
    node.create_vgpu(2, 0, "high", 60, 1 << 30)


def test_auto_release_refuses_a_negative_bound(node: Node) -> None:
    with pytest.raises(ValueError, match="bound"):
        node.set_release_auto(0, -0.001)


def test_auto_release_refuses_an_unknown_card(node: Node) -> None:
    with pytest.raises(NotFoundError, match="card with index 3"):
        node.set_release_auto(3, 0.001)


def test_auto_release_refuses_a_delay_above_60_s(node: Node) -> None:
    with pytest.raises(InvalidArgumentError, match="60 s"):
        node.set_release_auto(0, 0.001, max_delay_s=61)
