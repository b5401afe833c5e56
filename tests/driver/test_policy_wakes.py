"""Which low-priority accounting wakes the sharing policy's sleepers: none under fixed-share,
where a sleeper waits for its own budget, and under burst-share only accounting that brings a
peer's scaled time up to a sleeper's less the slack (the card's `policy_wakes` counts them)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from qshare_driver import Client, Node

GiB = 1 << 30
AHEAD_S = 0.05  # device time the sleeper has used: 100 ms scaled at a 50 % share
SLACK_S = 0.002  # burst-share's lead before a vGPU yields (policy.c BS_SLACK_NS)


def _asleep(node: Node, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while node.sleepers(0)["policy_waiters"] == 0:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


@contextmanager
def _held_sleeper(node: Node, policy: str) -> Iterator[tuple[Client, threading.Thread]]:
    """Two LP vGPUs at 50 %: A has used AHEAD_S of device time and waits in a launch on a
    thread of its own; B has used a little. Yields B's client and A's thread."""
    node.set_policy(0, policy)
    node.create_vgpu(1, 0, "low", 50, GiB)
    node.create_vgpu(2, 0, "low", 50, GiB)
    with (
        Client.attach(node.name, 1, node.directory) as a,
        Client.attach(node.name, 2, node.directory) as b,
    ):
        b.account_device_time(0.0001)
        a.account_device_time(AHEAD_S)
        launch = threading.Thread(target=a.launch_begin, daemon=True)
        launch.start()
        try:
            assert _asleep(node)
            yield b, launch
        finally:  # A's thread must leave its launch before A detaches
            node.set_policy(0, "best-effort")
            launch.join(10)
        a.launch_end()


def test_fixed_share_accounting_wakes_no_sleeper(node: Node) -> None:
    with _held_sleeper(node, "fixed-share") as (b, _):
        for _ in range(50):
            b.account_device_time(0.0001)
        assert node.card_stats(0).policy_wakes == 0


def test_burst_share_accounting_behind_a_sleeper_wakes_nobody(node: Node) -> None:
    with _held_sleeper(node, "burst-share") as (b, _):
        for _ in range(50):
            b.account_device_time(0.0001)
        assert node.card_stats(0).policy_wakes == 0


def test_burst_share_accounting_that_catches_up_with_a_sleeper_wakes_it_once(
    node: Node,
) -> None:
    with _held_sleeper(node, "burst-share") as (b, launch):
        b.account_device_time(AHEAD_S - SLACK_S / 2)
        launch.join(10)
        assert not launch.is_alive()
        assert node.card_stats(0).policy_wakes == 1
