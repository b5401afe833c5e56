"""Simulated workload processes on the simulated device: the training loop, inference
bursts and raw launch loops used by the demo, the benchmarks and the tests.

Each runs in its own process (multiprocessing, spawn), attaches to a vGPU through the
real driver and reports what it saw through a queue.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event as MpEvent
from typing import Protocol

from qshare_driver import Client
from qshare_driver.client import now_ns


class _Queue(Protocol):
    def put(self, obj: object) -> None: ...


@dataclass
class Timeline:
    """What one process did (monotonic ns): kernels as (start, end) on the card, the time
    each launch was submitted, and the waits as (submitted, unblocked)."""

    vgpu: int
    pid: int
    kernels: list[tuple[int, int]] = field(default_factory=list)
    submits: list[int] = field(default_factory=list)
    waits: list[tuple[int, int]] = field(default_factory=list)

    @property
    def unblocks(self) -> list[int]:
        return [u for _, u in self.waits]


def _record(client: Client, timeline: Timeline, seconds: float) -> None:
    before = client.last_unblock_ns
    submitted = now_ns()
    client.run_kernel(seconds)
    end = now_ns()
    timeline.submits.append(submitted)
    timeline.kernels.append((max(submitted, end - round(seconds * 1e9)), end))
    after = client.last_unblock_ns
    if after != before:
        timeline.waits.append((submitted, after))


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


def inference_bursts(
    segment: str,
    directory: str,
    vgpu: int,
    bursts: list[tuple[float, int]],
    kernel_s: float,
    ready: MpEvent,
    go: MpEvent,
    out: _Queue,
) -> None:
    """A high-priority server: at each (offset s, kernels) it runs that many kernels."""
    timeline = Timeline(vgpu, os.getpid())
    with Client.attach(segment, vgpu, directory) as client:
        ready.set()
        go.wait()
        t0 = time.monotonic()
        for offset, kernels in bursts:
            time.sleep(max(0.0, t0 + offset - time.monotonic()))
            for _ in range(kernels):
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
