"""The priority gate with real processes: high priority closes the card at once and
never waits; every low-priority context blocks until high priority has been quiet for
the release delay, and not before."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

from qshare.sim_workloads import Timeline, launch_loop, training_loop
from qshare_driver import Client, EventKind, Node
from qshare_driver.client import now_ns

GiB = 1 << 30


DELAY_S = 0.05


def _start_lps(
    node: Node, ctx: SpawnContext, spawn: Callable[..., SpawnProcess], target: Any, count: int
) -> tuple[Any, Any]:
    stop, out = ctx.Event(), ctx.Queue()
    for i in range(count):
        vgpu = 10 + i
        node.create_vgpu(vgpu, 0, "low", 20, GiB)
        ready = ctx.Event()
        extra = (0.0005,) if target is training_loop else ()
        spawn(target, node.name, node.directory, vgpu, *extra, ready, stop, out)
        assert ready.wait(30)
    return stop, out


def _collect(stop: Any, out: Any, count: int) -> list[Timeline]:
    stop.set()
    return [out.get(timeout=30) for _ in range(count)]


def _hp_burst(node: Node, hold_s: float) -> tuple[int, int]:
    node.create_vgpu(1, 0, "high", 50, GiB)
    node.set_release_delay(0, DELAY_S)
    with Client.attach(node.name, 1, node.directory) as hp:
        time.sleep(0.05)
        _, t_closed = hp.timed_launch_begin()  # the gate is closed for every LP by then
        time.sleep(hold_s)
        t_end = now_ns()
        hp.launch_end()
        time.sleep(DELAY_S + 0.1)
    return t_closed, t_end


@contextmanager
def _hp_and_lp(node: Node, delay_s: float) -> Iterator[tuple[Client, Client]]:
    """A high-priority and a low-priority client on card 0, whose release delay is `delay_s`."""
    node.create_vgpu(1, 0, "high", 50, GiB)
    node.create_vgpu(2, 0, "low", 50, GiB)
    node.set_release_delay(0, delay_s)
    with (
        Client.attach(node.name, 1, node.directory) as hp,
        Client.attach(node.name, 2, node.directory) as lp,
    ):
        yield hp, lp


def test_high_priority_launch_closes_the_card_at_once(node: Node) -> None:
    node.create_vgpu(1, 0, "high", 50, GiB)
    with Client.attach(node.name, 1, node.directory) as hp:
        assert not node.card_stats(0).busy
        hp.launch_begin()
        assert node.card_stats(0).busy
        hp.launch_end()


def test_every_low_priority_context_blocks_while_high_priority_is_busy(
    node: Node, ctx: SpawnContext, spawn: Callable[..., SpawnProcess]
) -> None:
    stop, out = _start_lps(node, ctx, spawn, launch_loop, 3)
    t_closed, t_end = _hp_burst(node, 0.3)
    timelines = _collect(stop, out, 3)
    for tl in timelines:
        inside = [t for t, _ in tl.kernels if t_closed < t < t_end + DELAY_S * 1e9]
        assert len(inside) <= 1, f"vGPU {tl.vgpu} launched {len(inside)} times while blocked"
        assert any(t > t_end for t, _ in tl.kernels), f"vGPU {tl.vgpu} never resumed"


def test_low_priority_resumes_after_the_release_delay_and_not_before(
    node: Node, ctx: SpawnContext, spawn: Callable[..., SpawnProcess]
) -> None:
    stop, out = _start_lps(node, ctx, spawn, training_loop, 2)
    _, t_end = _hp_burst(node, 0.1)
    timelines = _collect(stop, out, 2)
    for tl in timelines:
        after = [u for u in tl.unblocks if u > t_end - 0.1e9]
        assert after, f"vGPU {tl.vgpu} was never blocked by the burst"
        assert min(after) >= t_end + DELAY_S * 1e9


def test_high_priority_contexts_never_block_each_other(node: Node) -> None:
    node.create_vgpu(1, 0, "high", 50, GiB)
    node.create_vgpu(2, 0, "high", 50, GiB)
    with (
        Client.attach(node.name, 1, node.directory) as a,
        Client.attach(node.name, 2, node.directory) as b,
    ):
        a.launch_begin()
        b.launch_begin()
        b.launch_end()
        a.launch_end()
        assert a.last_unblock_ns == 0 and b.last_unblock_ns == 0


def test_release_delay_of_zero_reopens_as_soon_as_high_priority_is_quiet(node: Node) -> None:
    with _hp_and_lp(node, 0) as (hp, lp):
        hp.launch_begin()
        t_end = now_ns()
        hp.launch_end()
        lp.launch_begin()
        lp.launch_end()
        assert lp.last_unblock_ns == 0 or lp.last_unblock_ns >= t_end
    kinds = [e.kind for e in node.events(0.2)]
    assert EventKind.BUSY in kinds and EventKind.IDLE in kinds


def _sleepers_while_blocked(
    node: Node, hp: Client, lp: Client, seconds: float
) -> tuple[list[int], int]:
    """The card's gate sleepers, sampled every 5 ms for `seconds` while `lp` waits on a launch
    behind a busy `hp`; then HP's end time, once the waiter has got through."""
    hp.launch_begin()
    waiter = threading.Thread(target=lambda: (lp.launch_begin(), lp.launch_end()), daemon=True)
    waiter.start()
    try:
        time.sleep(0.05)
        assert waiter.is_alive(), "the low-priority launch did not wait on the closed gate"
        samples = []
        for _ in range(round(seconds / 0.005)):
            samples.append(node.sleepers(0)["gate_sleepers"])
            time.sleep(0.005)
    finally:  # the waiter must be through before its client detaches
        t_end = now_ns()
        hp.launch_end()
        waiter.join(5)
    assert not waiter.is_alive()
    return samples, t_end


def test_a_waiter_sleeps_through_high_priority_work_without_asking_each_completion_to_wake_it(
    node: Node,
) -> None:
    with _hp_and_lp(node, DELAY_S) as (hp, lp):
        sleepers, t_end = _sleepers_while_blocked(node, hp, lp, 0.15)
        # nobody for HP's end to wake: a waiter asking for it would count in every sample; a
        # sample may straddle the owner's release thread re-arming (every 50 ms, its two counts
        # raised one after the other), which reads as one for that sample only
        assert sleepers.count(0) > len(sleepers) // 2, sleepers
        assert lp.last_unblock_ns >= t_end + DELAY_S * 1e9


def test_with_a_delay_too_short_to_sleep_through_a_waiter_is_woken_when_high_priority_is_quiet(
    node: Node,
) -> None:
    with _hp_and_lp(node, 0) as (hp, lp):
        sleepers, t_end = _sleepers_while_blocked(node, hp, lp, 0.05)
        assert min(sleepers) == 1
        assert lp.last_unblock_ns >= t_end


def test_explicit_suspension_holds_low_priority_until_resumed(
    node: Node, ctx: SpawnContext, spawn: Callable[..., SpawnProcess]
) -> None:
    stop, out = _start_lps(node, ctx, spawn, launch_loop, 1)
    time.sleep(0.05)
    node.suspend(10)
    time.sleep(0.05)
    t_suspended = now_ns()
    time.sleep(0.2)
    t_resume = now_ns()
    node.resume(10)
    time.sleep(0.1)
    (tl,) = _collect(stop, out, 1)
    inside = [t for t, _ in tl.kernels if t_suspended < t < t_resume]
    assert inside == []
    assert any(t > t_resume for t, _ in tl.kernels)
    kinds = [e.kind for e in node.events(0.1)]
    assert kinds.index(EventKind.SUSPENDED) < kinds.index(EventKind.RESUMED)
