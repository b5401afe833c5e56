"""Workload processes on the simulated device, for the co-location benchmark and the policy
tests: a low-priority "training" loop and a high-priority "inference" request generator.
Either is synthetic (kernels of one size) or a replay of a real kernel timeline
(bench/traces/, `trace` set): training replays its steps back to back, bounded by the
card's LP window; each inference request replays one recorded request.

Each runs in its own process (multiprocessing, spawn), attaches to one vGPU through the real
driver and reports what it saw through a queue. Times are the driver's CLOCK_MONOTONIC ns.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import time
from dataclasses import dataclass, field
from multiprocessing.queues import Queue
from typing import Any

from qshare.bench import traces
from qshare_driver import Client
from qshare_driver.client import now_ns

SPAWN = mp.get_context("spawn")


@dataclass(frozen=True)
class LpSpec:
    """A loop of kernels of `kernel_s` from `start_ns` until `end_ns`."""

    segment: str
    directory: str
    vgpu_id: int
    kernel_s: float
    duration_s: float
    log_from_s: float = 0.0  # kernels launched in [log_from_s, log_to_s) after start are logged
    log_to_s: float = 0.0
    delay_s: float = 0.0  # begin this long after the common start (the end stays the same)
    trace: str = ""  # a trace workload to replay instead of kernels of kernel_s
    device_gate: bool = False  # the trace's queue reaches the card a slice at a time, gated


@dataclass
class LpResult:
    vgpu_id: int
    kernels: int
    steps: int = 0  # training steps replayed (trace workloads)
    unblocks: list[int] = field(default_factory=list)
    # (launch ns, unblock ns or 0, end ns) of kernels launched inside the log window
    intervals: list[tuple[int, int, int]] = field(default_factory=list)
    cpu_s: float = 0.0  # the process's CPU time (user + system) from the start time to the end


@dataclass(frozen=True)
class HpSpec:
    """Requests of `kernels` x `kernel_s`, Poisson at `rate` per second. `busy_s`/`period_s`
    make it bursty: arrivals only in the first `busy_s` of every `period_s`."""

    segment: str
    directory: str
    vgpu_id: int
    kernel_s: float
    kernels: int
    rate: float
    duration_s: float
    seed: int
    busy_s: float = 0.0
    period_s: float = 0.0
    trace: str = ""  # a trace workload whose one request is replayed instead of kernels


@dataclass
class HpResult:
    base_kernel_ns: int  # median wall time of one kernel on an otherwise idle card
    arrivals: list[int] = field(default_factory=list)
    first_kernel_ns: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    kernel_ends: list[int] = field(default_factory=list)


# A training step's kernels go to the card back to back (in C), as launches queue on a GPU;
# a Python round trip between single simulated kernels would leave the card idle.
LP_BATCH_S = 0.002


def _sleep_until(t_ns: int) -> None:
    while (left := t_ns - now_ns()) > 0:
        time.sleep(left / 1e9)


def _lp_round(client: Client, spec: LpSpec, rows: list[tuple[int, int]]) -> tuple[int, int]:
    """One round of the training loop: (kernels, steps) it ran."""
    if rows:
        if spec.device_gate:
            client.replay_gated(rows)
        else:
            client.replay(rows, client.lp_window_s)
        return len(rows), traces.summary(spec.trace)["steps"]
    batch = max(1, round(LP_BATCH_S / spec.kernel_s))
    client.run_kernels(batch, spec.kernel_s)
    return batch, 0


def lp_main(spec: LpSpec, inbox: Queue[Any], out: Queue[Any]) -> None:
    """Attach, report ready, wait for the start time from `inbox`, run the training loop and
    put an `LpResult` on `out`."""
    rows = traces.timeline(spec.trace, traces.host_scale(spec.trace)) if spec.trace else []
    with Client.attach(spec.segment, spec.vgpu_id, spec.directory) as client:
        out.put("ready")
        start_ns: int = inbox.get()
        end_ns = start_ns + round(spec.duration_s * 1e9)
        log_from, log_to = (start_ns + round(t * 1e9) for t in (spec.log_from_s, spec.log_to_s))
        result = LpResult(spec.vgpu_id, 0)
        cpu0 = time.process_time()
        _sleep_until(start_ns + round(spec.delay_s * 1e9))
        last = 0
        while (t0 := now_ns()) < end_ns:
            kernels, steps = _lp_round(client, spec, rows)
            unblock = client.last_unblock_ns
            if unblock != last:
                result.unblocks.append(unblock)
                last = unblock
            if log_from <= t0 < log_to:
                result.intervals.append((t0, unblock if unblock >= t0 else 0, now_ns()))
            result.kernels += kernels
            result.steps += steps
        result.cpu_s = time.process_time() - cpu0
    out.put(result)


def _calibrate(client: Client, spec: HpSpec, rows: list[tuple[int, int]]) -> int:
    """Median wall time to the end of a request's first kernel, alone on the card."""
    walls = []
    for _ in range(40 if not rows else 10):
        t0 = now_ns()
        if rows:
            walls.append(client.replay(rows)[0] - t0)
        else:
            client.run_kernel(spec.kernel_s)
            walls.append(now_ns() - t0)
    return sorted(walls)[len(walls) // 2]


def _serve(client: Client, spec: HpSpec, rows: list[tuple[int, int]], result: HpResult) -> None:
    """One request: its kernels, their end times recorded."""
    t0 = now_ns()
    if rows:
        first, last = client.replay(rows)
        result.first_kernel_ns.append(first - t0)
        result.kernel_ends.append(last)
        return
    client.run_kernel(spec.kernel_s)
    result.kernel_ends.append(now_ns())
    result.first_kernel_ns.append(result.kernel_ends[-1] - t0)
    for _ in range(spec.kernels - 1):
        client.run_kernel(spec.kernel_s)
        result.kernel_ends.append(now_ns())


def arrival_times(spec: HpSpec, start_ns: int) -> list[int]:
    """The request arrival times (ns) of `spec` from `start_ns`, reproducible from its seed."""
    rng = random.Random(spec.seed)
    span = spec.duration_s
    t, times = 0.0, list[int]()
    while True:
        t += rng.expovariate(spec.rate)
        if spec.period_s and t % spec.period_s >= spec.busy_s:
            t = (t // spec.period_s + 1) * spec.period_s + rng.expovariate(spec.rate)
        if t >= span:
            return times
        times.append(start_ns + round(t * 1e9))


def hp_main(spec: HpSpec, inbox: Queue[Any], out: Queue[Any]) -> None:
    """Attach and calibrate alone, report ready, wait for the start time from `inbox`, serve
    the requests and put an `HpResult` on `out`."""
    rows = traces.request_timeline(spec.trace) if spec.trace else []
    with Client.attach(spec.segment, spec.vgpu_id, spec.directory) as client:
        result = HpResult(_calibrate(client, spec, rows))
        out.put("ready")
        start_ns: int = inbox.get()
        for arrival in arrival_times(spec, start_ns):
            _sleep_until(arrival)
            _serve(client, spec, rows, result)
            result.arrivals.append(arrival)
            result.ends.append(result.kernel_ends[-1])
    out.put(result)


@dataclass
class Worker:
    process: mp.process.BaseProcess
    inbox: Queue[Any]
    out: Queue[Any]


def start(target: Any, spec: LpSpec | HpSpec) -> Worker:
    """Start `target(spec, inbox, out)` in a spawned process."""
    inbox: Queue[Any] = SPAWN.Queue()
    out: Queue[Any] = SPAWN.Queue()
    proc = SPAWN.Process(target=target, args=(spec, inbox, out), daemon=True)
    proc.start()
    return Worker(proc, inbox, out)


def go(workers: list[Worker], lead_s: float = 0.05, timeout: float = 60.0) -> int:
    """Wait until every worker is ready, then start them all at one time; returns it (ns)."""
    for w in workers:
        if w.out.get(timeout=timeout) != "ready":
            raise RuntimeError("a workload process failed to start")
    start_ns = now_ns() + round(lead_s * 1e9)
    for w in workers:
        w.inbox.put(start_ns)
    return start_ns


def collect(workers: list[Worker], timeout: float = 60.0) -> list[Any]:
    """The result of every worker, in order; raises if one did not report in time."""
    results = [w.out.get(timeout=timeout) for w in workers]
    for w in workers:
        w.process.join(timeout)
    return results
