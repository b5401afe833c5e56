"""Real kernel timelines (bench/traces/, captured on an H100) turned into launch timelines
that the fake CUDA driver and the simulated card replay: per launch, the host time before
it and the device time it runs.

The profiler that captured them slows the host about twice (a training step took ~43 ms
profiled against 22.4 ms measured unprofiled on the same card), so host gaps are scaled
by HOST_SCALE by default. A trace has fewer launch calls than device operations (some
calls run several kernels); the device operations are shared out among the calls in
order, so each call's device time is the sum of its share and the total is kept.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

TRACE_FILE = Path(__file__).parent / "traces" / "h100-pytorch-2.11.json"
HOST_SCALE = 0.5
LP_TRAINING = "lp_resnet50_train_bs64"
LP_GPT2 = "lp_gpt2_train_bs8x512"
HP_GRAPH = "hp_resnet50_infer_bs1_graph"
HP_EAGER = "hp_resnet50_infer_bs1_eager"
HP_BERT = "hp_bert_base_infer_bs1x128_eager"


@cache
def _workloads() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(TRACE_FILE.read_text())
    return dict(data["workloads"])


def names() -> list[str]:
    return sorted(_workloads())


def summary(name: str) -> dict[str, Any]:
    return dict(_workloads()[_known(name)]["summary"])


def _known(name: str) -> str:
    if name not in _workloads():
        raise ValueError(f"unknown trace workload {name!r}; known: {', '.join(names())}")
    return name


def timeline(name: str, host_scale: float = HOST_SCALE) -> list[tuple[int, int]]:
    """(host gap ns before the launch, device ns of the launch) for each launch call."""
    if not 0.0 <= host_scale <= 10.0:
        raise ValueError(f"host_scale must be in [0, 10], got {host_scale}")
    w = _workloads()[_known(name)]
    host: list[list[float]] = w["host_launches"]
    device = [float(d[2]) for d in w["device"]]
    calls = len(host)
    out: list[tuple[int, int]] = []
    for i, (start, _dur) in enumerate(host):
        first, last = i * len(device) // calls, (i + 1) * len(device) // calls
        gap_us = start - host[i - 1][0] if i else 0.0
        out.append((round(gap_us * host_scale * 1000), round(sum(device[first:last]) * 1000)))
    return out


def host_scale(name: str) -> float:
    """The host scale a workload is replayed at: training's host gaps are halved (calibrated
    to the unprofiled step time); inference requests keep theirs (an eager ResNet-50
    request took 7 ms unprofiled, as in the trace)."""
    return HOST_SCALE if name.startswith("lp_") else 1.0


def request_timeline(name: str) -> list[tuple[int, int]]:
    """One inference request: the middle of the trace's profiled steps, from its first launch."""
    rows = timeline(name, host_scale(name))
    steps = int(summary(name)["steps"])
    per = len(rows) // steps
    middle = rows[per : 2 * per] if steps >= 2 else rows
    return [(0, middle[0][1]), *middle[1:]]


def write_timeline(path: Path, name: str, host_scale: float = HOST_SCALE) -> int:
    """Write the timeline as trace-replay reads it; returns the number of launches."""
    rows = timeline(name, host_scale)
    path.write_text("".join(f"{gap} {dur}\n" for gap, dur in rows))
    return len(rows)


def replay_model_ns(rows: list[tuple[int, int]], window_ns: int | None) -> int:
    """Wall time of a timeline on an ideal launcher and card: the host spends each gap, the
    card runs kernels in order, and a launch waits while the unfinished device work queued
    is `window_ns` or more (None: never). What a window costs by itself, with no overhead."""
    from qshare_driver import lp_window_admits  # here: `bench gpu` reads traces without cffi

    host = device_end = 0
    for gap, dur in rows:
        host += gap
        if window_ns is not None and not lp_window_admits(max(device_end - host, 0), window_ns):
            host = device_end - window_ns + 1
        device_end = max(host, device_end) + dur
    return max(host, device_end)


def window_model_ratio(name: str, window_ns: int, host_scale: float = HOST_SCALE) -> float:
    """Throughput with the window ÷ without, on the ideal launcher (replay_model_ns)."""
    rows = timeline(name, host_scale)
    return replay_model_ns(rows, None) / replay_model_ns(rows, window_ns)
