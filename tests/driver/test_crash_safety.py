"""SIGKILL at any point leaves the node working: locks recover, reservations return,
a dead high-priority context releases its card, and every death is an event."""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from multiprocessing.context import SpawnContext, SpawnProcess

from qshare.sim_workloads import hold_busy_then_die, reserve_forever, training_loop
from qshare_driver import Client, EventKind, Node
from qshare_driver.client import now_ns

GiB = 1 << 30
MiB = 1 << 20


def _wait_for(kind: EventKind, node: Node, timeout: float = 5.0) -> list[EventKind]:
    seen: list[EventKind] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ev = node.next_event(0.1)
        if ev is not None:
            seen.append(ev.kind)
            if ev.kind == kind:
                return seen
    raise AssertionError(f"no {kind.name} event; saw {[k.name for k in seen]}")


def test_killed_process_inside_the_memory_lock_leaves_it_usable(
    node: Node, ctx: SpawnContext, spawn: Callable[..., SpawnProcess]
) -> None:
    node.create_vgpu(1, 0, "low", 50, GiB)
    rng = random.Random(7)
    for _ in range(5):
        ready = ctx.Event()
        p = spawn(reserve_forever, node.name, node.directory, 1, 64 * MiB, ready)
        assert ready.wait(30)
        time.sleep(rng.uniform(0.001, 0.03))
        os.kill(p.pid or 0, signal.SIGKILL)
        p.join(10)
        _wait_for(EventKind.CLIENT_DIED, node)
    assert node.vgpu_stats(1).mem_used == 0
    with Client.attach(node.name, 1, node.directory) as c:
        c.reserve(GiB)


def test_killed_busy_high_priority_process_releases_the_card(
    node: Node, ctx: SpawnContext, spawn: Callable[..., SpawnProcess]
) -> None:
    node.create_vgpu(1, 0, "high", 50, GiB)
    node.set_release_delay(0, 0.02)
    ready = ctx.Event()
    spawn(hold_busy_then_die, node.name, node.directory, 1, ready)
    assert ready.wait(30)
    seen = _wait_for(EventKind.IDLE, node)
    assert EventKind.CLIENT_DIED in seen
    assert not node.card_stats(0).busy


def test_killed_blocked_low_priority_process_leaves_the_others_running(
    node: Node, ctx: SpawnContext, spawn: Callable[..., SpawnProcess]
) -> None:
    node.create_vgpu(1, 0, "high", 50, GiB)
    node.set_release_delay(0, 0.02)
    stop, out = ctx.Event(), ctx.Queue()
    procs = []
    for vgpu in (10, 11):
        node.create_vgpu(vgpu, 0, "low", 20, GiB)
        ready = ctx.Event()
        procs.append(
            spawn(training_loop, node.name, node.directory, vgpu, 0.0005, ready, stop, out)
        )
        assert ready.wait(30)
    with Client.attach(node.name, 1, node.directory) as hp:
        hp.launch_begin()
        time.sleep(0.05)
        os.kill(procs[0].pid or 0, signal.SIGKILL)
        _wait_for(EventKind.CLIENT_DIED, node)
        hp.launch_end()
    t_end = now_ns()
    time.sleep(0.15)
    stop.set()
    survivor = out.get(timeout=30)
    assert survivor.vgpu == 11
    assert any(start > t_end for start, _ in survivor.kernels)
    assert node.vgpu_stats(10).contexts == 0
