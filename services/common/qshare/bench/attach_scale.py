"""Attach latency as the node fills up: p50/p99 of one attach with 1, 64 and 4,096 contexts
attached (the last is the documented maximum), measured through the driver's binding. A vGPU
holds at most QS_MAX_CONTEXTS_PER_VGPU (64) contexts, so the held contexts are spread over 64
vGPUs, filled from the last; the timed attaches go to vGPU 1, which is filled last."""

from __future__ import annotations

import tempfile
import time
import uuid
from typing import Any

from qshare.bench.stats import percentiles
from qshare_driver import Client, Node
from qshare_driver.errors import TableFullError

LEVELS = (1, 64, 4096)
GiB = 1 << 30
PER_VGPU = 64  # QS_MAX_CONTEXTS_PER_VGPU
VGPUS = 4096 // PER_VGPU


def _timed_attaches(name: str, directory: str, samples: int) -> list[float]:
    """Attach and detach `samples` times; the attach times in ms."""
    times = []
    for _ in range(samples):
        start = time.perf_counter_ns()
        client = Client.attach(name, 1, directory)
        times.append((time.perf_counter_ns() - start) / 1e6)
        client.detach()
    return times


def _holder(held: int) -> int:
    """The vGPU the context after `held` others is held on: vGPU 64 first, vGPU 1 last."""
    return VGPUS - held // PER_VGPU


def _refused(name: str, directory: str) -> bool:
    """The attach past the node's capacity fails with the typed error."""
    try:
        Client.attach(name, 1, directory).detach()
    except TableFullError:
        return True
    return False


def measure(quick: bool = False) -> dict[str, Any]:
    """For each level L: with L - 1 contexts held (`held`), the attach that makes L."""
    samples = 50 if quick else 300
    out: dict[str, Any] = {"samples": samples}
    with tempfile.TemporaryDirectory(prefix="qsa") as directory:
        name = f"attach-{uuid.uuid4().hex[:8]}"
        with Node.create(name, directory) as node:
            node.add_card(0, "GPU-attach-scale", 16 * GiB)
            for vgpu in range(1, VGPUS + 1):
                node.create_vgpu(vgpu, 0, "low", 1, GiB // 4)
            held: list[Client] = []
            for level in LEVELS:
                while len(held) < level - 1:
                    held.append(Client.attach(name, _holder(len(held)), directory))
                times = _timed_attaches(name, directory, samples)
                out[f"contexts_{level}"] = percentiles(times, (50, 99))
                out[f"contexts_{level}"]["held"] = sum(
                    node.vgpu_stats(v).contexts for v in range(1, VGPUS + 1)
                )
            held.append(Client.attach(name, _holder(len(held)), directory))
            out["refused_past_capacity"] = _refused(name, directory)
            for client in held:
                client.detach()
    return out


def table_lines(result: dict[str, Any]) -> list[str]:
    return [
        f"attach at {level:>5} contexts  p50 {result[f'contexts_{level}']['p50']:.3f} ms   "
        f"p99 {result[f'contexts_{level}']['p99']:.3f} ms"
        for level in LEVELS
    ]
