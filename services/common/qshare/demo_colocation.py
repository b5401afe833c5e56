"""The co-location scenario of `make demo`: one high-priority inference process with
bursts of work and two low-priority trainers on one simulated card, through the real
driver; prints the timeline and the measured preemption and release latencies."""

from __future__ import annotations

import multiprocessing as mp
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

from qshare.bench.stats import percentile
from qshare.sim_workloads import Timeline, inference_bursts, training_loop
from qshare_driver import EventKind, Node

GiB = 1 << 30
HP_KERNEL_S = 0.001
LP_KERNEL_S = 0.0005
BURSTS = [(0.2, 30), (0.7, 15), (1.1, 40)]
RELEASE_DELAY_S = 0.1
COLUMN_NS = 20_000_000  # one column of the printed timeline


def _start(node: Node, ctx: Any) -> tuple[list[Any], Any, Any, Any]:
    stop, go, out = ctx.Event(), ctx.Event(), ctx.Queue()
    procs = []
    for vgpu in (2, 3):
        ready = ctx.Event()
        args = (node.name, node.directory, vgpu, LP_KERNEL_S, ready, stop, out)
        procs.append(ctx.Process(target=training_loop, args=args, daemon=True))
        procs[-1].start()
        ready.wait(60)
    ready = ctx.Event()
    hp_args = (node.name, node.directory, 1, BURSTS, HP_KERNEL_S, ready, go, out)
    procs.append(ctx.Process(target=inference_bursts, args=hp_args, daemon=True))
    procs[-1].start()
    ready.wait(60)
    return procs, stop, go, out


def _run(node: Node) -> list[Timeline]:
    ctx = mp.get_context("spawn")
    procs, stop, go, out = _start(node, ctx)
    go.set()
    hp = out.get(timeout=60)
    time.sleep(RELEASE_DELAY_S + 0.15)
    stop.set()
    lps = [out.get(timeout=60) for _ in range(2)]
    for p in procs:
        p.join(10)
    return [hp, *sorted(lps, key=lambda t: t.vgpu)]


def _row(tl: Timeline, t0: int, columns: int) -> str:
    cells = [" "] * columns
    for submitted, unblocked in tl.waits:
        _paint(cells, submitted - t0, unblocked - t0, "-")
    for start, end in tl.kernels:
        _paint(cells, start - t0, end - t0, "#")
    return "".join(cells)


def _paint(cells: list[str], start: int, end: int, mark: str) -> None:
    for c in range(max(0, start // COLUMN_NS), min(len(cells), end // COLUMN_NS + 1)):
        cells[c] = mark


def _timeline(timelines: list[Timeline], out: Callable[[str], None]) -> int:
    t0 = timelines[0].submits[0] - round(0.15e9)
    t_last = max(k[1] for tl in timelines for k in tl.kernels[-1:])
    columns = int((t_last - t0) // COLUMN_NS) + 1
    out(f"timeline, one column = {COLUMN_NS / 1e6:.0f} ms   (# running, - suspended)")
    labels = ["inference (high)", "training A (low)", "training B (low)"]
    for label, tl in zip(labels, timelines, strict=True):
        out(f"  {label:<18}|{_row(tl, t0, columns)}|")
    return t0


def _latencies(timelines: list[Timeline]) -> tuple[list[float], list[float]]:
    hp, lps = timelines[0], timelines[1:]
    preempt = [(k[0] - s) / 1e6 for s, k in zip(hp.submits, hp.kernels, strict=True)]
    burst_ends = _burst_ends(hp)
    release = []
    for end in burst_ends:
        target = end + RELEASE_DELAY_S * 1e9
        for tl in lps:
            wakes = [u for u in tl.unblocks if u > end]
            if wakes:
                release.append((min(wakes) - target) / 1e6)
    return preempt, release


def _burst_ends(hp: Timeline) -> list[int]:
    ends = []
    for (_, end), (nxt, _) in zip(hp.kernels, [*hp.kernels[1:], (None, None)], strict=True):
        if nxt is None or nxt - end > RELEASE_DELAY_S * 1e9:
            ends.append(end)
    return ends


def _events(node: Node, t0: int, out: Callable[[str], None]) -> None:
    shown = (EventKind.BUSY, EventKind.IDLE)
    for ev in node.events(0.05):
        if ev.kind in shown:
            what = "busy: low priority suspended" if ev.kind == EventKind.BUSY else "idle: resumed"
            out(f"  t={(ev.time_ns - t0) / 1e6:8.1f} ms  card {ev.card} {what}")


def run_colocation_demo(out: Callable[[str], None] = print) -> None:
    directory = tempfile.mkdtemp(prefix="qsd")
    try:
        with Node.create("demo", directory) as node:
            node.add_card(0, "GPU-sim-0", 16 * GiB)
            node.create_vgpu(1, 0, "high", 50, 4 * GiB)
            node.create_vgpu(2, 0, "low", 50, 4 * GiB)
            node.create_vgpu(3, 0, "low", 50, 4 * GiB)
            out(f"co-location on a simulated card, release delay {RELEASE_DELAY_S * 1e3:.0f} ms")
            timelines = _run(node)
            t0 = _timeline(timelines, out)
            _events(node, t0, out)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    preempt, release = _latencies(timelines)
    out(
        f"preemption latency (HP submit -> HP kernel start): p50 {percentile(preempt, 50):.3f} ms,"
        f" max {max(preempt):.3f} ms over {len(preempt)} kernels"
    )
    if release:
        out(
            f"release latency (LP resume - (HP idle + delay)): p50 {percentile(release, 50):.3f} "
            f"ms, max {max(release):.3f} ms over {len(release)} resumptions"
        )


if __name__ == "__main__":
    run_colocation_demo()
