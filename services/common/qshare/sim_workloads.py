"""Simulated workload processes on the simulated device: the training loop, inference
bursts and raw launch loops used by the demo, the benchmarks and the tests.

Each runs in its own process (multiprocessing, spawn), attaches to a vGPU through the
real driver and reports what it saw through a queue.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event as MpEvent
from typing import Protocol

from qshare_driver import Client
from qshare_driver.client import now_ns


class _Queue(Protocol):
    def put(self, obj: object) -> None: ...


@dataclass
class Timeline:
    """What one process did: kernel intervals (monotonic ns) and when it was unblocked."""

    vgpu: int
    pid: int
    kernels: list[tuple[int, int]] = field(default_factory=list)
    unblocks: list[int] = field(default_factory=list)


def _record(client: Client, timeline: Timeline, seconds: float) -> None:
    before = client.last_unblock_ns
    start = now_ns()
    client.run_kernel(seconds)
    timeline.kernels.append((start, now_ns()))
    after = client.last_unblock_ns
    if after != before:
        timeline.unblocks.append(after)


def training_loop(
    segment: str,
    directory: str,
    vgpu: int,
    kernel_s: float,
    ready: MpEvent,
    stop: MpEvent,
    out: _Queue,
) -> None:
    """A low-priority trainer: kernels back to back until `stop`."""
    timeline = Timeline(vgpu, os.getpid())
    with Client.attach(segment, vgpu, directory) as client:
        ready.set()
        while not stop.is_set():
            _record(client, timeline, kernel_s)
    out.put(timeline)


def launch_loop(
    segment: str, directory: str, vgpu: int, ready: MpEvent, stop: MpEvent, out: _Queue
) -> None:
    """Bare launch_begin/launch_end pairs, recording when each begin returned."""
    timeline = Timeline(vgpu, os.getpid())
    with Client.attach(segment, vgpu, directory) as client:
        ready.set()
        while not stop.is_set():
            client.launch_begin()
            t = now_ns()
            client.launch_end()
            timeline.kernels.append((t, t))
    out.put(timeline)


def hold_busy_then_die(segment: str, directory: str, vgpu: int, ready: MpEvent) -> None:
    """A high-priority process that starts work and is killed before finishing it."""
    client = Client.attach(segment, vgpu, directory)
    client.launch_begin()
    ready.set()
    os.kill(os.getpid(), signal.SIGKILL)


def reserve_forever(segment: str, directory: str, vgpu: int, chunk: int, ready: MpEvent) -> None:
    """Reserve and release in a tight loop until killed (to be killed inside the lock)."""
    client = Client.attach(segment, vgpu, directory)
    ready.set()
    while True:
        client.reserve(chunk)
        client.release(chunk)
