"""Low priority's in-flight window in device time: set per card at run time, reported in
the card's statistics, applied as the card's while a high-priority process is attached."""

from __future__ import annotations

import pytest

from qshare_driver import (
    Client,
    InvalidArgumentError,
    Node,
    NotFoundError,
    lp_window_admits,
    lp_window_in_force_ns,
)
from qshare_driver._lib import check, lib

GiB = 1 << 30


def test_window_defaults_to_500_microseconds(node: Node) -> None:
    assert node.card_stats(0).lp_window_s == pytest.approx(0.0005)


def test_window_set_at_run_time_is_reported_in_card_stats(node: Node) -> None:
    node.set_lp_window(0, 0.0025)
    assert node.card_stats(0).lp_window_s == pytest.approx(0.0025)


@pytest.mark.parametrize("seconds", [0.0, 2.0])
def test_window_outside_1us_to_1s_is_refused(node: Node, seconds: float) -> None:
    with pytest.raises(ValueError, match="LP window"):
        node.set_lp_window(0, seconds)
    assert node.card_stats(0).lp_window_s == pytest.approx(0.0005)


def test_window_on_an_unknown_card_is_refused_by_name(node: Node) -> None:
    with pytest.raises(NotFoundError, match="card"):
        node.set_lp_window(3, 0.002)


def test_driver_refuses_a_window_below_one_microsecond(node: Node) -> None:
    with pytest.raises(InvalidArgumentError, match="LP window"):
        check(node._call(lib.qs_card_set_lp_window, 0, 999))


def test_launcher_applies_the_card_window_only_while_high_priority_is_attached(
    node: Node, shm_dir: str
) -> None:
    node.create_vgpu(1, 0, "high", 50, GiB)
    node.create_vgpu(2, 0, "low", 50, GiB)
    node.set_lp_window(0, 0.002)
    with Client.attach(node.name, 2, shm_dir) as lp:
        assert lp.lp_window_s == pytest.approx(0.020)  # nobody to protect
        with Client.attach(node.name, 1, shm_dir):
            assert lp.lp_window_s == pytest.approx(0.002)


def test_device_gate_is_off_by_default(node: Node) -> None:
    assert node.card_stats(0).lp_device_gate is False


def test_device_gate_set_at_run_time_is_reported_in_card_stats(node: Node) -> None:
    node.set_lp_device_gate(0, True)
    assert node.card_stats(0).lp_device_gate is True
    node.set_lp_device_gate(0, False)
    assert node.card_stats(0).lp_device_gate is False


def test_device_gate_on_an_unknown_card_is_refused_by_name(node: Node) -> None:
    with pytest.raises(NotFoundError, match="card"):
        node.set_lp_device_gate(3, True)


def test_driver_refuses_a_device_gate_other_than_0_or_1(node: Node) -> None:
    with pytest.raises(InvalidArgumentError, match="device gate"):
        check(node._call(lib.qs_card_set_lp_device_gate, 0, 2))


def test_a_client_reads_its_cards_device_gate(node: Node, shm_dir: str) -> None:
    node.create_vgpu(2, 0, "low", 50, GiB)
    node.set_lp_device_gate(0, True)
    with Client.attach(node.name, 2, shm_dir) as lp:
        assert lp._call(lib.qs_client_lp_device_gate) == 1


@pytest.mark.parametrize(
    ("queued_ns", "window_ns", "admitted"),
    [(0, 1000, True), (999, 1000, True), (1000, 1000, False), (5000, 1000, False), (0, 0, True)],
)
def test_window_rule_admits_a_launch_while_less_than_the_window_is_queued(
    queued_ns: int, window_ns: int, admitted: bool
) -> None:
    """The one rule (qs_lp_window_admits) that the interposer, the simulated card's replay and
    the benchmarks' ideal launcher all apply: nothing in flight always admits."""
    assert lp_window_admits(queued_ns, window_ns) is admitted


def test_window_in_force_with_the_device_gate_is_at_least_the_one_kept_alone() -> None:
    alone = int(lib.QS_LP_WINDOW_ALONE_NS)
    assert lp_window_in_force_ns(500_000, True) == alone
    assert lp_window_in_force_ns(500_000, False) == 500_000
    assert lp_window_in_force_ns(2 * alone, True) == 2 * alone


def test_window_rule_refuses_negative_nanoseconds_by_name() -> None:
    with pytest.raises(ValueError, match="queued_ns"):
        lp_window_admits(-1, 1000)
