"""`qshare bench chaos`: a soak of the driver under SIGKILL. A simulated node runs bursty
high-priority and saturating low-priority workloads, memory churn and attach churn under
every sharing policy in turn, while a loop SIGKILLs random workload processes (at the gate,
in policy waits, mid-allocation, mid-attach) and restarts them. Afterwards nothing may be
left behind: memory, contexts, sleeper counts; the high-priority fast path costs what it
cost before; and no low-priority process waited at the gate longer than the longest
high-priority burst plus the release delay plus 10 ms."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import signal
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.context import SpawnProcess
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event as MpEvent
from typing import Any

from qshare_driver import Client, Node, Policy
from qshare_driver.client import now_ns

GiB = 1 << 30
MiB = 1 << 20
HP_VGPU, LP_VGPUS = 1, (10, 11, 12)
RELEASE_DELAY_S = 0.02
STALL_SLACK_MS = 10.0
HP_BURST_KERNELS, HP_KERNEL_S, HP_IDLE_S = 10, 0.0005, 0.05
LP_KERNEL_S = 0.0005
KILL_PERIOD_S = 0.05
FAST_PATH_PAIRS, FAST_PATH_RUNS = 100_000, 9


def lp_worker(name: str, d: str, vgpu: int, stop: MpEvent, stall_ns: Synchronized[int]) -> None:
    """Saturating low priority with memory churn; records its longest gate wait."""
    client = Client.attach(name, vgpu, d)
    while not stop.is_set():
        client.reserve(MiB)
        before = now_ns()
        client.run_kernel(LP_KERNEL_S)
        unblock = client.last_unblock_ns
        if unblock > before and unblock - before > stall_ns.value:
            stall_ns.value = unblock - before
        client.release(MiB)
    client.detach()


def hp_worker(name: str, d: str, vgpu: int, stop: MpEvent, burst_ns: Synchronized[int]) -> None:
    """Bursts of high priority separated by idle gaps; records its longest burst."""
    client = Client.attach(name, vgpu, d)
    while not stop.is_set():
        start = now_ns()
        client.run_kernels(HP_BURST_KERNELS, HP_KERNEL_S)
        if now_ns() - start > burst_ns.value:
            burst_ns.value = now_ns() - start
        time.sleep(HP_IDLE_S)
    client.detach()


def attach_worker(name: str, d: str, vgpu: int, stop: MpEvent, _: Synchronized[int]) -> None:
    """Attach, reserve, detach in a loop: kills land mid-attach and mid-allocation."""
    while not stop.is_set():
        with Client.attach(name, vgpu, d) as client:
            client.reserve(4 * MiB)
            client.release(2 * MiB)


Worker = Callable[[str, str, int, MpEvent, "Synchronized[int]"], None]


@dataclass
class Slot:
    """One workload kind, restarted in place whenever it is killed."""

    target: Worker
    vgpu: int
    value: Synchronized[int]
    proc: SpawnProcess | None = None


class Soak:
    def __init__(self, node: Node, directory: str, seed: int) -> None:
        self.node, self.dir, self.rng = node, directory, random.Random(seed)
        self.ctx = mp.get_context("spawn")
        self.stop = self.ctx.Event()
        self.slots: list[Slot] = []
        self.kills = 0

    def add(self, target: Worker, vgpu: int) -> None:
        slot = Slot(target, vgpu, self.ctx.Value("q", 0))
        self.slots.append(slot)
        self.start(slot)

    def start(self, slot: Slot) -> None:
        args = (self.node.name, self.dir, slot.vgpu, self.stop, slot.value)
        slot.proc = self.ctx.Process(target=slot.target, args=args, daemon=True)
        slot.proc.start()

    def kill_one(self) -> None:
        slot = self.rng.choice(self.slots)
        if slot.proc is not None and slot.proc.is_alive():
            os.kill(slot.proc.pid or 0, signal.SIGKILL)
            slot.proc.join(5)
            self.kills += 1
        self.start(slot)

    def finish(self) -> None:
        self.stop.set()
        for slot in self.slots:
            if slot.proc is not None:
                slot.proc.join(15)
                if slot.proc.is_alive():
                    slot.proc.kill()
                    slot.proc.join(5)


def fast_path_ns(node: Node) -> float:
    """High-priority launch_begin + launch_end in a C loop, nobody else on the card: the best
    of several runs, as other load on the machine only ever adds to it."""
    with Client.attach(node.name, HP_VGPU, node.directory) as hp:
        return min(hp.launch_overhead_ns(FAST_PATH_PAIRS) for _ in range(FAST_PATH_RUNS))


def _settle(node: Node, timeout_s: float = 10.0) -> None:
    """Wait until every context is gone (the owner reaps on its own schedule)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(node.vgpu_stats(v).contexts == 0 for v in (HP_VGPU, *LP_VGPUS)):
            return
        time.sleep(0.05)


def _leaks(node: Node) -> dict[str, int]:
    stats = [node.vgpu_stats(v) for v in (HP_VGPU, *LP_VGPUS)]
    return {
        "leaked_bytes": sum(s.mem_used for s in stats),
        "leaked_contexts": sum(s.contexts for s in stats),
        "leaked_sleepers": sum(node.sleepers(0).values()),
    }


def _soak(node: Node, directory: str, seconds: float, seed: int) -> tuple[Soak, float]:
    soak = Soak(node, directory, seed)
    soak.add(hp_worker, HP_VGPU)
    for vgpu in LP_VGPUS:
        soak.add(lp_worker, vgpu)
        soak.add(lp_worker, vgpu)
    soak.add(attach_worker, LP_VGPUS[0])
    policies = [Policy.BEST_EFFORT, Policy.FIXED_SHARE, Policy.BURST_SHARE]
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        node.set_policy(0, policies[min(2, int(elapsed * 3 / seconds))])
        time.sleep(soak.rng.uniform(0.5, 1.5) * KILL_PERIOD_S)
        soak.kill_one()
    soak.finish()
    return soak, time.monotonic() - start


def run(args: argparse.Namespace) -> dict[str, Any]:
    seconds = 6.0 if args.quick else 30.0
    with tempfile.TemporaryDirectory(prefix="qsc") as directory:
        name = f"chaos-{uuid.uuid4().hex[:8]}"
        with Node.create(name, directory) as node:
            node.add_card(0, "GPU-chaos-0", 16 * GiB)
            node.set_release_delay(0, RELEASE_DELAY_S)
            node.create_vgpu(HP_VGPU, 0, "high", 50, 4 * GiB)
            for vgpu in LP_VGPUS:
                node.create_vgpu(vgpu, 0, "low", 30, 2 * GiB)
            before = fast_path_ns(node)
            soak, took = _soak(node, directory, seconds, seed=7)
            _settle(node)
            leaks = _leaks(node)
            after = fast_path_ns(node)
    burst_ms = max(s.value.value for s in soak.slots if s.target is hp_worker) / 1e6
    block_ms = max(s.value.value for s in soak.slots if s.target is lp_worker) / 1e6
    return {
        "benchmark": "chaos",
        "seconds": round(took, 2),
        "kills": soak.kills,
        **leaks,
        "max_lp_gate_wait_ms": round(block_ms, 3),
        "max_hp_burst_ms": round(burst_ms, 3),
        "max_stall_ms": round(max(0.0, block_ms - burst_ms), 3),
        "max_stall_ms_bound": RELEASE_DELAY_S * 1e3 + STALL_SLACK_MS,
        "hp_begin_end_ns": {"before": round(before, 1), "after": round(after, 1)},
        "hp_begin_end_ratio": round(after / before, 3),
    }


def table(result: dict[str, Any]) -> str:
    hp = result["hp_begin_end_ns"]
    return "\n".join(
        [
            f"chaos soak — {result['seconds']} s, {result['kills']} SIGKILLs",
            f"leaked: {result['leaked_bytes']} bytes, {result['leaked_contexts']} contexts, "
            f"{result['leaked_sleepers']} sleepers",
            f"HP begin+end: {hp['before']:.1f} ns before, {hp['after']:.1f} ns after "
            f"(x{result['hp_begin_end_ratio']:.3f}; limit x1.10)",
            f"longest LP gate wait {result['max_lp_gate_wait_ms']:.1f} ms, longest HP burst "
            f"{result['max_hp_burst_ms']:.1f} ms: stall {result['max_stall_ms']:.1f} ms "
            f"(bound {result['max_stall_ms_bound']:.0f} ms)",
        ]
    )
