"""`qshare bench gate`: the priority gate on one simulated card with several low-priority
processes — how fast high priority closes the card, how exactly low priority is
released after the delay, and what a launch costs when nobody contends."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any

from qshare.bench.stats import percentiles
from qshare.sim_workloads import Timeline, training_loop
from qshare_driver import Client, EventKind, Node
from qshare_driver.client import now_ns

GiB = 1 << 30
LP_PROCESSES = 3
LP_KERNEL_S = 0.0005
HP_WORK_S = 0.0002
FAST_DELAY_S = 0.001
DEFAULT_DELAY_S = 0.1


@dataclass
class Episode:
    begin_ns: int  # just before the HP launch_begin
    closed_ns: int  # just after it returned: the gate is closed for every LP context
    end_ns: int  # just before the HP launch_end: last HP activity
    delay_s: float


def _wait_idle(node: Node, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ev = node.next_event(0.5)
        if ev is not None and ev.kind == EventKind.IDLE:
            return
    raise RuntimeError("the card never went idle")


def _episode(node: Node, hp: Client, delay_s: float, rng: random.Random) -> Episode:
    time.sleep(rng.uniform(0, 0.002))  # land anywhere in the LP kernels
    begin, closed = hp.timed_launch_begin()
    time.sleep(HP_WORK_S)
    end = now_ns()
    hp.launch_end()
    _wait_idle(node)
    return Episode(begin, closed, end, delay_s)


def _release_errors_ms(episodes: list[Episode], timelines: list[Timeline]) -> list[float]:
    """Per LP context and episode: first wake-up after the release point, minus that point."""
    errors: list[float] = []
    for i, ep in enumerate(episodes):
        release = ep.end_ns + ep.delay_s * 1e9
        horizon = episodes[i + 1].begin_ns if i + 1 < len(episodes) else float("inf")
        for tl in timelines:
            wakes = [u for u in tl.unblocks if ep.closed_ns < u < horizon]
            if wakes:
                errors.append((min(wakes) - release) / 1e6)
    return errors


def _most_lp_kernels_after_close(episodes: list[Episode], timelines: list[Timeline]) -> int:
    """Most kernels one LP context started between the gate closing and HP's end in any
    episode: only the unit it had in flight when the gate closed may run (bound: 1)."""
    most = 0
    for ep in episodes:
        for tl in timelines:
            n = sum(1 for s, _ in tl.kernels if ep.closed_ns < s < ep.end_ns)
            most = max(most, n)
    return most


def _overheads(node: Node, iterations: int) -> dict[str, float]:
    node.add_card(1, "GPU-sim-quiet", 16 * GiB)
    node.create_vgpu(90, 1, "low", 50, GiB)
    node.create_vgpu(91, 1, "high", 50, GiB)
    result: dict[str, float] = {}
    for name, vgpu in (("low", 90), ("high", 91)):
        with Client.attach(node.name, vgpu, node.directory) as c:
            c.launch_overhead_ns(iterations // 10)  # warm up
            result[name] = min(c.launch_overhead_ns(iterations) for _ in range(3))
    return result


def _run_episodes(
    node: Node, hp: Client, count: int, delay_s: float, rng: random.Random
) -> list[Episode]:
    node.set_release_delay(0, delay_s)
    return [_episode(node, hp, delay_s, rng) for _ in range(count)]


def _measure(node: Node, fast: int, slow: int) -> tuple[list[Episode], list[Timeline]]:
    ctx = mp.get_context("spawn")
    stop, out = ctx.Event(), ctx.Queue()
    procs = []
    for i in range(LP_PROCESSES):
        node.create_vgpu(10 + i, 0, "low", 30, GiB)
        ready = ctx.Event()
        args = (node.name, node.directory, 10 + i, LP_KERNEL_S, ready, stop, out)
        procs.append(ctx.Process(target=training_loop, args=args, daemon=True))
        procs[-1].start()
        ready.wait(60)
    node.create_vgpu(1, 0, "high", 50, GiB)
    rng = random.Random(1)
    with Client.attach(node.name, 1, node.directory) as hp:
        episodes = _run_episodes(node, hp, fast, FAST_DELAY_S, rng)
        episodes += _run_episodes(node, hp, slow, DEFAULT_DELAY_S, rng)
    stop.set()
    timelines = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(10)
    return episodes, timelines


def run(args: argparse.Namespace) -> dict[str, Any]:
    fast, slow, iters = (500, 5, 200_000) if args.quick else (10_000, 30, 5_000_000)
    directory = tempfile.mkdtemp(prefix="qsb")
    try:
        with Node.create(f"bench-{uuid.uuid4().hex[:6]}", directory) as node:
            node.add_card(0, "GPU-sim-0", 16 * GiB)
            episodes, timelines = _measure(node, fast, slow)
            overhead = _overheads(node, iters)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return _figures(episodes, timelines, overhead)


def _figures(
    episodes: list[Episode], timelines: list[Timeline], overhead: dict[str, float]
) -> dict[str, Any]:
    gate_us = [(e.closed_ns - e.begin_ns) / 1e3 for e in episodes]
    fast = [e for e in episodes if e.delay_s == FAST_DELAY_S]
    slow = [e for e in episodes if e.delay_s == DEFAULT_DELAY_S]
    return {
        "episodes": len(episodes),
        "lp_processes": LP_PROCESSES,
        "lp_kernel_ms": LP_KERNEL_S * 1e3,
        "gate_latency_us": percentiles(gate_us, (50, 99, 99.9), ("p50", "p99", "p999")),
        "release_error_ms": percentiles(_release_errors_ms(fast, timelines), (50, 99)),
        "release_delay_ms": FAST_DELAY_S * 1e3,
        "release_error_ms_at_100ms_delay": percentiles(
            _release_errors_ms(slow, timelines), (50, 99)
        ),
        "lp_kernels_after_close_max_per_context": _most_lp_kernels_after_close(episodes, timelines),
        "launch_overhead_ns": {k: round(v, 1) for k, v in overhead.items()},
        "targets": {
            "gate_latency_us_p99": 20,
            "release_error_ms_p99": 1,
            "launch_overhead_ns": 100,
        },
    }


def table(result: dict[str, Any]) -> str:
    g, r, r100 = (
        result["gate_latency_us"],
        result["release_error_ms"],
        result["release_error_ms_at_100ms_delay"],
    )
    o = result["launch_overhead_ns"]
    rows = [
        f"episodes: {result['episodes']} with {result['lp_processes']} LP processes "
        f"({result['lp_kernel_ms']} ms kernels)",
        f"{'figure':<40}{'p50':>10}{'p99':>10}{'p999':>10}{'target':>10}",
        f"{'gate latency (us)':<40}{g['p50']:>10.2f}{g['p99']:>10.2f}{g['p999']:>10.2f}"
        f"{'<= 20':>10}",
        f"{'release error (ms), delay 1 ms':<40}{r['p50']:>10.3f}{r['p99']:>10.3f}{'':>10}"
        f"{'<= 1':>10}",
        f"{'release error (ms), delay 100 ms':<40}{r100['p50']:>10.3f}{r100['p99']:>10.3f}",
        f"{'launch overhead (ns), high / low':<40}{o['high']:>10.1f}{o['low']:>10.1f}{'':>10}"
        f"{'<= 100':>10}",
        f"most kernels one LP context started while HP held the card: "
        f"{result['lp_kernels_after_close_max_per_context']} (its unit in flight; bound 1)",
    ]
    return "\n".join(rows)
