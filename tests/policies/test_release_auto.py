"""The auto release mode: switched at run time, and under steady online traffic it lets low
priority harvest what a fixed 100 ms delay starves. Asserted on device-time counters."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from qshare.bench.coloc_workers import HpSpec, LpSpec, collect, go, hp_main, lp_main, start
from qshare_driver import Node
from qshare_driver.client import now_ns


def test_release_mode_switches_between_auto_and_fixed_at_run_time(shm_dir: str) -> None:
    with Node.create(f"r{uuid.uuid4().hex[:8]}", shm_dir) as node:
        node.add_card(0, "GPU-sim-0", 16 << 30)
        node.set_release_delay(0, 0.05)
        node.set_release_auto(0, 0.001, max_delay_s=0.2)
        auto = node.release_auto(0)
        assert auto.enabled and auto.delay_s == 0.2 and auto.p99_bound_s == 0.001
        node.set_release_fixed(0)
        fixed = node.release_auto(0)
        assert not fixed.enabled and fixed.delay_s == 0.05


def lp_share_under_steady_traffic(shm_dir: str, auto: bool) -> tuple[float, float]:
    """LP's share of the card between 1.5 s and 3 s of steady HP traffic (30 % load), and the
    release delay in force at the end."""
    name = f"r{uuid.uuid4().hex[:8]}"
    with Node.create(name, shm_dir) as node:
        node.add_card(0, "GPU-sim-0", 16 << 30)
        node.create_vgpu(1, 0, "high", 50, 1 << 30)
        node.create_vgpu(2, 0, "low", 50, 1 << 30)
        if auto:
            node.set_release_auto(0, 0.001)
        # the workers outlast the measurement: with no LP left, auto mode keeps the maximum
        hp = HpSpec(name, shm_dir, 1, 0.0005, 4, 150.0, 3.5, seed=3)
        workers = [start(hp_main, hp), start(lp_main, LpSpec(name, shm_dir, 2, 0.0005, 3.5))]
        t0 = go(workers)
        time.sleep((t0 - now_ns()) / 1e9 + 1.5)
        a = (now_ns(), node.vgpu_stats(2).device_ns)
        time.sleep(1.5)
        b = (now_ns(), node.vgpu_stats(2).device_ns)
        delay = node.release_auto(0).delay_s
        collect(workers)
    return (b[1] - a[1]) / (b[0] - a[0]), delay


def test_auto_release_harvests_steady_traffic_that_a_fixed_100ms_delay_starves(
    shm_dir: str,
) -> None:
    fixed, fixed_delay = lp_share_under_steady_traffic(shm_dir, auto=False)
    harvested, auto_delay = lp_share_under_steady_traffic(shm_dir, auto=True)
    assert fixed_delay == 0.1 and fixed < 0.05, (fixed_delay, fixed)
    assert auto_delay < 0.01 and harvested > 0.3, (auto_delay, harvested)


@contextmanager
def auto_card(shm_dir: str) -> Iterator[tuple[str, Node]]:
    """A simulated card in auto mode (bound 1 ms), vGPU 1 high priority and 2 low."""
    name = f"r{uuid.uuid4().hex[:8]}"
    with Node.create(name, shm_dir) as node:
        node.add_card(0, "GPU-sim-0", 16 << 30)
        node.create_vgpu(1, 0, "high", 50, 1 << 30)
        node.create_vgpu(2, 0, "low", 50, 1 << 30)
        node.set_release_auto(0, 0.001)
        yield name, node


def auto_penalty(shm_dir: str, device_gate: bool) -> float:
    """The wait auto mode expects a high-priority launch to have behind low priority's kernels
    of 50 µs, each queued up to the card's window (500 µs), after 1.5 s of steady traffic."""
    with auto_card(shm_dir) as (name, node):
        node.set_lp_device_gate(0, device_gate)
        hp = HpSpec(name, shm_dir, 1, 0.0005, 4, 150.0, 2.0, seed=3)
        workers = [start(hp_main, hp), start(lp_main, LpSpec(name, shm_dir, 2, 0.00005, 2.0))]
        t0 = go(workers)
        time.sleep((t0 - now_ns()) / 1e9 + 1.5)
        penalty = node.release_auto(0).penalty_s
        collect(workers)
    return penalty


def test_auto_release_expects_high_priority_to_wait_for_the_window(shm_dir: str) -> None:
    assert auto_penalty(shm_dir, device_gate=False) >= 0.0005


def test_auto_release_expects_a_slice_with_the_device_gate(shm_dir: str) -> None:
    assert 0.0001 <= auto_penalty(shm_dir, device_gate=True) < 0.0005


def test_auto_release_leaves_the_maximum_under_a_rate_whose_decayed_count_stays_under_50(
    shm_dir: str,
) -> None:
    """15 requests/s of one kernel: the history's decayed count settles near 30 gaps (rate x
    the 2 s time constant), so the warm-up must count the gaps seen, not the decayed count."""
    with auto_card(shm_dir) as (name, node):
        hp = HpSpec(name, shm_dir, 1, 0.0005, 1, 15.0, 7.0, seed=3)
        workers = [start(hp_main, hp), start(lp_main, LpSpec(name, shm_dir, 2, 0.0005, 7.0))]
        t0 = go(workers)
        time.sleep((t0 - now_ns()) / 1e9 + 6.0)
        auto = node.release_auto(0)
        collect(workers)
    assert auto.gaps >= 50 and auto.delay_s < 0.01, auto
