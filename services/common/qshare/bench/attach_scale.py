"""Attach latency as the node fills up: p50/p99 of one attach with 1, 64 and 4,096 contexts
attached (the last is the documented maximum), measured through the driver's binding."""

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


def _timed_attaches(name: str, directory: str, samples: int) -> list[float]:
    """Attach and detach `samples` times; the attach times in ms."""
    times = []
    for _ in range(samples):
        start = time.perf_counter_ns()
        client = Client.attach(name, 1, directory)
        times.append((time.perf_counter_ns() - start) / 1e6)
        client.detach()
    return times


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
            node.create_vgpu(1, 0, "low", 10, GiB)
            held: list[Client] = []
            for level in LEVELS:
                while len(held) < level - 1:
                    held.append(Client.attach(name, 1, directory))
                times = _timed_attaches(name, directory, samples)
                out[f"contexts_{level}"] = percentiles(times, (50, 99))
                out[f"contexts_{level}"]["held"] = node.vgpu_stats(1).contexts
            held.append(Client.attach(name, 1, directory))
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
