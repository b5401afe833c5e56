"""Sharing policies among low-priority vGPUs, measured on the simulated card: target against
measured share of every vGPU over 1 s windows, the card's utilization, the fallback of a
bursting vGPU and the delay before a run-time policy change takes effect."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from qshare.bench.coloc_stats import window_shares
from qshare.bench.coloc_workers import LpSpec, collect, go, lp_main, start
from qshare_driver import Node
from qshare_driver.client import now_ns

SAMPLE_S = 0.025
REACT_S = 0.1  # target: burst-share falls back, and a policy change takes effect, within this


@dataclass(frozen=True)
class Tenant:
    """A low-priority vGPU running `processes` training loops from `start_s` on. Two by
    default: a training job keeps work queued, and with one kernel in flight per process a
    single process leaves its share idle whenever the host wakes it late."""

    vgpu_id: int
    share: int
    start_s: float = 0.0
    kernel_s: float = 0.0005
    processes: int = 2


@dataclass
class Mix:
    t0: int
    samples: list[tuple[int, list[int]]]  # (ns, device ns of each tenant)
    switched_at: int = 0
    policy_wakes: int = 0  # times LP accounting woke the policy's sleepers (the card's count)
    cpu_s: float = 0.0  # CPU time of every LP process over the run


def host_cost(mix: Mix, seconds: float) -> dict[str, float]:
    """What the policy costs the host: policy wake-ups and LP processes' CPU, per second."""
    return {"policy_wakes_per_s": mix.policy_wakes / seconds, "lp_cpu_per_s": mix.cpu_s / seconds}


def run_mix(
    directory: str,
    policy: str,
    tenants: list[Tenant],
    seconds: float,
    switch_to: tuple[float, str] | None = None,
) -> Mix:
    """Run the tenants on one card under `policy` (optionally switched to another policy at
    some time), sampling their device-time counters every SAMPLE_S."""
    with Node.create("policies", directory=directory, replace=True) as node:
        node.add_card(0, "GPU-sim-policies", 16 << 30)
        node.set_policy(0, policy)
        for t in tenants:
            node.create_vgpu(t.vgpu_id, 0, "low", t.share, 1 << 30)
        workers = [
            start(
                lp_main,
                LpSpec("policies", directory, t.vgpu_id, t.kernel_s, seconds, delay_s=t.start_s),
            )
            for t in tenants
            for _ in range(t.processes)
        ]
        t0 = go(workers)
        mix = Mix(t0, [])
        end = t0 + round(seconds * 1e9)
        while (now := now_ns()) < end:
            if switch_to and not mix.switched_at and now >= t0 + switch_to[0] * 1e9:
                node.set_policy(0, switch_to[1])
                mix.switched_at = now_ns()
            mix.samples.append((now, [node.vgpu_stats(t.vgpu_id).device_ns for t in tenants]))
            time.sleep(SAMPLE_S)
        mix.cpu_s = sum(r.cpu_s for r in collect(workers))
        mix.policy_wakes = node.card_stats(0).policy_wakes
    return mix


def shares_between(mix: Mix, lo_s: float, hi_s: float, window_s: float) -> list[list[float]]:
    """Shares (percent of the card) of each tenant over every `window_s` window inside
    [lo_s, hi_s) after the start."""
    lo, hi = mix.t0 + lo_s * 1e9, mix.t0 + hi_s * 1e9
    inside = [(t, c) for t, c in mix.samples if lo <= t <= hi]
    return [[100 * s for s in shares] for _, shares in window_shares(inside, round(window_s * 1e9))]


def _errors(measured: list[list[float]], targets: list[float | None]) -> list[dict[str, Any]]:
    out = []
    for k, target in enumerate(targets):
        if target is None:
            continue
        values = [w[k] for w in measured]
        errs = [abs(v - target) for v in values]
        out.append(
            {
                "tenant": k,
                "target": target,
                "measured_mean": sum(values) / len(values),
                "error_mean": sum(errs) / len(errs),
                "error_worst": max(errs),
                "above_worst": max(0.0, max(v - target for v in values)),
                "windows": len(values),
            }
        )
    return out


def _phase(
    mix: Mix, lo_s: float, hi_s: float, window_s: float, targets: list[float | None]
) -> dict[str, Any]:
    measured = shares_between(mix, lo_s, hi_s, window_s)
    busy = [sum(w) for w in measured]
    used = [[100 * v / max(1e-9, sum(w)) for v in w] for w in measured]
    return {
        "from_s": lo_s,
        "to_s": hi_s,
        "window_s": window_s,
        "vgpus": _errors(measured, targets),
        "of_used_time": _errors(used, targets),
        "utilization_min": min(busy) / 100,
        "utilization_mean": sum(busy) / len(busy) / 100,
    }


def _first_time(mix: Mix, after_ns: int, k: int, below: float, window_s: float = 0.1) -> float:
    """Seconds after `after_ns` until tenant k's share over the next `window_s` is <= below."""
    w = round(window_s * 1e9)
    for t, shares in window_shares(mix.samples, w):
        if t >= after_ns and 100 * shares[k] <= below:
            return (t - after_ns) / 1e9
    return float("inf")


def run_policies(directory: str, seconds: float) -> dict[str, Any]:
    """The four policy experiments, each `seconds` long."""
    half, w = seconds / 2, min(1.0, seconds / 4)
    settle = 0.15
    out: dict[str, Any] = {}
    be = run_mix(
        directory, "best-effort", [Tenant(11, 30), Tenant(12, 30), Tenant(13, 30)], seconds
    )
    out["best-effort"] = {
        "shares": [30, 30, 30],
        "host": host_cost(be, seconds),
        "phases": [_phase(be, settle, seconds, w, [100 / 3] * 3)],
    }
    fs = run_mix(directory, "fixed-share", [Tenant(11, 20), Tenant(12, 50, start_s=half)], seconds)
    out["fixed-share"] = {
        "shares": [20, 50],
        "host": host_cost(fs, seconds),
        "phases": [
            _phase(fs, settle, half, w, [20, None]),
            _phase(fs, half + settle, seconds, w, [20, 50]),
        ],
    }
    bs = run_mix(directory, "burst-share", [Tenant(11, 30), Tenant(12, 70, start_s=half)], seconds)
    fallback = _first_time(bs, bs.t0 + round(half * 1e9), 0, 32)
    out["burst-share"] = {
        "shares": [30, 70],
        "host": host_cost(bs, seconds),
        "phases": [
            _phase(bs, settle, half, w, [100, None]),
            _phase(bs, half + settle, seconds, w, [30, 70]),
        ],
        "fallback_s": fallback,
        "fallback_met": fallback <= REACT_S,
    }
    ch = run_mix(
        directory,
        "best-effort",
        [Tenant(11, 20), Tenant(12, 50)],
        seconds,
        switch_to=(half, "fixed-share"),
    )
    effect = _first_time(ch, ch.switched_at, 0, 22)
    out["change"] = {
        "from": "best-effort",
        "to": "fixed-share",
        "shares": [20, 50],
        "host": host_cost(ch, seconds),
        "effect_s": effect,
        "effect_met": effect <= REACT_S,
        "phases": [_phase(ch, half + settle, seconds, w, [20, 50])],
    }
    return out


def table_policies(result: dict[str, Any]) -> str:
    lines = ["policy       phase        vGPU target measured  err mean  err worst  util"]
    for name in ("best-effort", "fixed-share", "burst-share", "change"):
        for ph in result[name]["phases"]:
            for v in ph["vgpus"]:
                lines.append(
                    f"{name:12} {ph['from_s']:4.1f}-{ph['to_s']:4.1f}s  {v['tenant']:4d} "
                    f"{v['target']:6.1f} {v['measured_mean']:8.1f} {v['error_mean']:9.2f} "
                    f"{v['error_worst']:10.2f} {ph['utilization_mean']:5.0%}"
                )
    for name in ("best-effort", "fixed-share", "burst-share", "change"):
        host = result[name].get("host")  # runs before the count was kept have none
        if host:
            lines.append(
                f"{name:12} host: {host['policy_wakes_per_s']:.0f} policy wake-ups/s, "
                f"LP processes' CPU {host['lp_cpu_per_s']:.2f} cores"
            )
    lines.append(
        f"burst-share fallback to share after the other vGPU returns: "
        f"{result['burst-share']['fallback_s'] * 1e3:.0f} ms; best-effort -> "
        f"fixed-share takes effect in {result['change']['effect_s'] * 1e3:.0f} ms "
        f"(target <= {REACT_S * 1e3:.0f} ms each)"
    )
    return "\n".join(lines)
