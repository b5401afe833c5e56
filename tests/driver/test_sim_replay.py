"""Replaying a recorded timeline on the simulated card: launches queue without waiting for
each kernel, every kernel is gated, ended and accounted, and a low-priority replay keeps
no more than its window queued ahead of a high-priority kernel."""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from multiprocessing.context import SpawnProcess
from typing import Any

import pytest

from qshare_driver import Client, Node
from qshare_driver.client import now_ns

GiB = 1 << 30
MS = 1_000_000


def test_replay_queues_launches_and_accounts_every_kernel(node: Node, shm_dir: str) -> None:
    node.create_vgpu(2, 0, "low", 50, GiB)
    with Client.attach(node.name, 2, shm_dir) as lp:
        t0 = now_ns()
        first, last = lp.replay([(0, 2 * MS)] * 50)
    stats = node.vgpu_stats(2)
    assert stats.launches == 50
    assert stats.device_ns == 100 * MS
    assert last - first == 98 * MS  # back to back on the card: nothing waited in between
    assert first >= t0 + 2 * MS


def test_replay_spends_the_host_gaps(node: Node, shm_dir: str) -> None:
    node.create_vgpu(2, 0, "low", 50, GiB)
    with Client.attach(node.name, 2, shm_dir) as lp:
        t0 = now_ns()
        _, last = lp.replay([(1 * MS, 0)] * 20)
    assert last - t0 >= 20 * MS


@pytest.mark.parametrize("bad", [[(-1, 5)], [(5, -1)]])
def test_negative_gaps_or_durations_are_refused(
    node: Node, shm_dir: str, bad: list[tuple[int, int]]
) -> None:
    node.create_vgpu(2, 0, "low", 50, GiB)
    with Client.attach(node.name, 2, shm_dir) as lp, pytest.raises(ValueError, match=">= 0"):
        lp.replay(bad)


def test_high_priority_waits_at_most_the_low_priority_window(
    node: Node, shm_dir: str, ctx: mp.context.SpawnContext, spawn: Callable[..., SpawnProcess]
) -> None:
    # behind at most the 3 ms window (plus the kernel running), never the 250 ms queued
    assert _high_priority_wait(node, shm_dir, ctx, spawn, 0.003, gated=False) < 20 * MS


def test_a_gated_replay_runs_and_accounts_every_kernel(node: Node, shm_dir: str) -> None:
    node.create_vgpu(2, 0, "low", 50, GiB)
    with Client.attach(node.name, 2, shm_dir) as lp:
        first, last = lp.replay([(0, 2 * MS)] * 50, 0.02, slice_s=100e-6)
    stats = node.vgpu_stats(2)
    assert stats.launches == 50
    assert stats.device_ns == 100 * MS
    assert last - first >= 98 * MS


def test_a_slice_must_be_positive(node: Node, shm_dir: str) -> None:
    node.create_vgpu(2, 0, "low", 50, GiB)
    with Client.attach(node.name, 2, shm_dir) as lp, pytest.raises(ValueError, match="slice"):
        lp.replay([(0, MS)], 0.02, slice_s=0.0)


def _lp_replay(name: str, directory: str, ready: Any, window_s: float, gated: bool) -> None:
    with Client.attach(name, 2, directory) as lp:
        ready.set()
        lp.replay([(0, 1 * MS)] * 400, window_s, slice_s=100e-6 if gated else None)


def _high_priority_wait(
    node: Node,
    shm_dir: str,
    ctx: mp.context.SpawnContext,
    spawn: Callable[..., SpawnProcess],
    window_s: float,
    gated: bool,
) -> int:
    """ns a 1 ms high-priority kernel takes from launch to end while LP replays 400 kernels of
    1 ms under `window_s` (with the device gate when `gated`)."""
    node.create_vgpu(1, 0, "high", 50, GiB)
    node.create_vgpu(2, 0, "low", 50, GiB)
    node.set_release_delay(0, 0.0)
    ready = ctx.Event()
    with Client.attach(node.name, 1, shm_dir) as hp:
        proc = spawn(_lp_replay, node.name, shm_dir, ready, window_s, gated)
        assert ready.wait(10)
        time.sleep(0.15)  # the replay is under way, its queue as deep as its window
        t0 = now_ns()
        hp.run_kernel(0.001)
        waited = now_ns() - t0
        proc.join(10)
    return waited


def test_with_the_device_gate_high_priority_waits_for_a_slice_not_the_queue(
    node: Node, shm_dir: str, ctx: mp.context.SpawnContext, spawn: Callable[..., SpawnProcess]
) -> None:
    # the kernel running and the slice booked (1 ms kernels: one a slice), not 100 ms
    assert _high_priority_wait(node, shm_dir, ctx, spawn, 0.1, gated=True) < 20 * MS


def test_without_the_device_gate_high_priority_waits_for_the_queue(
    node: Node, shm_dir: str, ctx: mp.context.SpawnContext, spawn: Callable[..., SpawnProcess]
) -> None:
    assert _high_priority_wait(node, shm_dir, ctx, spawn, 0.1, gated=False) > 50 * MS
