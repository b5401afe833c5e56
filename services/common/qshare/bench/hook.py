"""`qshare bench hook`: what the CUDA interposer costs, measured against the fake driver.

Launches per second straight to the fake libcuda.so.1 and through libqshare-cuda.so (as a
high- and as a low-priority vGPU), the nanoseconds each launch gains, and how long a process
takes to attach (its first cuInit), alone and with 64 processes starting at once. The
replay runs the ResNet-50 training trace (bench/traces/) through the fake driver, kernels
of their recorded durations on its device thread and the recorded host gaps between
launches, directly and as a low-priority vGPU: the throughput ratio and the added ns/launch,
also with the launches spread round-robin over two streams (the trace has no stream ids).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from qshare.bench import attach_scale, traces
from qshare.bench.stats import percentile
from qshare.bench.testnode import FAKE_UUID, HP_VGPU, LP_VGPU, test_node, vgpu_env
from qshare.native_build import TOOLS, build_cuda

GIB = 1 << 30
DEVICE_GATE = {"QSHARE_LP_DEVICE_GATE": "1"}
Env = dict[str, str] | None
DEFAULT_LP_WINDOW_US = 500  # QS_DEFAULT_LP_WINDOW_NS


def probe(env: dict[str, str], commands: Sequence[str]) -> dict[str, dict[str, str]]:
    done = subprocess.run(
        [str(TOOLS / "probe-direct"), *commands],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    replies: dict[str, dict[str, str]] = {}
    for line in done.stdout.splitlines():
        head, *pairs = line.split()
        replies[head] = dict(pair.split("=", 1) for pair in pairs)
    return replies


def ns_per_launch(env: dict[str, str], launches: int, repeats: int) -> float:
    runs = [
        float(probe(env, ["init", f"bench {launches}"])["bench"]["ns_per_launch"])
        for _ in range(repeats)
    ]
    return statistics.median(runs)


def ns_per_alloc_pair(env: dict[str, str], kind: str, pairs: int, repeats: int) -> float:
    """One allocation of 1 MiB of `kind` and its free, the median over `repeats` runs."""
    runs = [
        float(probe(env, ["init", f"allocbench {pairs} {kind}"])["allocbench"]["ns_per_pair"])
        for _ in range(repeats)
    ]
    return statistics.median(runs)


def alloc_costs(directory: Path, seg: str, pairs: int, repeats: int) -> dict[str, Any]:
    """What the interposer adds to an allocation and its free: an ordinary one (`plain`), and a
    stream-ordered one (`async`, which asks the driver about its stream and pool)."""
    costs: dict[str, Any] = {}
    for kind in ("plain", "async"):
        direct = ns_per_alloc_pair(vgpu_env(directory, seg, None), kind, pairs, repeats)
        interposed = ns_per_alloc_pair(vgpu_env(directory, seg, LP_VGPU), kind, pairs, repeats)
        costs[kind] = {"direct": direct, "interposed": interposed, "added": interposed - direct}
    return {"pairs_per_run": pairs, "runs": repeats, "ns_per_pair": costs}


def attach_ms(env: dict[str, str], processes: int, rounds: int) -> list[float]:
    """cuInit time under the interposer (the attach), `processes` started together."""
    times: list[float] = []
    argv = [str(TOOLS / "probe-direct"), "init"]
    for _ in range(rounds):
        procs = [
            subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
            for _ in range(processes)
        ]
        for proc in procs:
            out, _ = proc.communicate(timeout=120)
            fields = dict(pair.split("=", 1) for pair in out.split()[1:])
            if fields["rc"] != "0":
                raise RuntimeError(f"attach failed: {out.strip()}")
            times.append(int(fields["init_ns"]) / 1e6)
    return times


def replay_wall_ns(
    env: dict[str, str], timeline: Path, passes: int, streams: int = 1
) -> tuple[int, int]:
    """(wall ns of `passes` timed passes, launches per pass) of one trace-replay run, its
    launches round-robin over `streams` streams."""
    done = subprocess.run(
        [str(TOOLS / "trace-replay"), str(timeline), str(passes), "1", str(streams)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    fields = dict(pair.split("=", 1) for pair in done.stdout.split()[1:])
    if done.returncode != 0 or fields.get("rc") != "0":
        raise RuntimeError(f"trace-replay failed: {done.stdout.strip()} {done.stderr.strip()}")
    return int(fields["wall_ns"]), int(fields["launches"])


@contextlib.contextmanager
def idle_high_priority(env: dict[str, str]) -> Iterator[None]:
    """A high-priority process attached to the card that launches nothing: the LP window is
    then the card's (500 us by default) instead of the wider one kept while nobody needs it."""
    proc = subprocess.Popen(
        [str(TOOLS / "probe-direct")],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("init\n")
    proc.stdin.flush()
    if "rc=0" not in proc.stdout.readline():
        proc.kill()
        raise RuntimeError("the idle high-priority process could not attach")
    try:
        yield
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def replay_pairs(
    directory: Path,
    seg: str,
    timeline: Path,
    passes: int,
    repeats: int,
    lp_env: Env = None,
    streams: int = 1,
) -> tuple[list[int], list[int], int]:
    """Wall ns of direct and interposed (LP, `lp_env` added) runs over `streams` streams,
    interleaved, the order alternating."""
    direct: list[int] = []
    hooked: list[int] = []
    launches = 0
    for i in range(repeats):
        envs = [vgpu_env(directory, seg, None), vgpu_env(directory, seg, LP_VGPU) | (lp_env or {})]
        for env in envs if i % 2 == 0 else envs[::-1]:
            wall, launches = replay_wall_ns(env, timeline, passes, streams)
            (direct if "LD_PRELOAD" not in env else hooked).append(wall)
    return direct, hooked, launches


def replay_figures(
    direct: list[int], hooked: list[int], launches: int, passes: int
) -> dict[str, Any]:
    """Medians of the pairs (each pair ran back to back, so a shared machine's load shifts
    both runs of a pair alike) and the spread of the pairs' ratios."""
    pairs = list(zip(direct, hooked, strict=True))
    ratios = sorted(a / b for a, b in pairs)
    return {
        "wall_ms": {
            "direct": statistics.median(direct) / 1e6,
            "interposed": statistics.median(hooked) / 1e6,
        },
        "lp_throughput_ratio": statistics.median(ratios),
        "lp_throughput_ratio_runs": {"min": ratios[0], "max": ratios[-1]},
        "ns_per_launch_added": statistics.median(b - a for a, b in pairs) / (passes * launches),
    }


def replay_stats(
    directory: Path, seg: str, timeline: Path, passes: int, lp_env: Env = None, streams: int = 1
) -> dict[str, Any]:
    """The interposer's statistics (QSHARE_STATS_FILE) over one more interposed run: the
    same counters `qshare bench gpu` collects on the real driver."""
    path = directory / "replay-stats.json"
    env = vgpu_env(directory, seg, LP_VGPU) | (lp_env or {}) | {"QSHARE_STATS_FILE": str(path)}
    replay_wall_ns(env, timeline, passes, streams)
    stats: dict[str, Any] = json.loads(path.read_text())
    return stats


def replay(directory: Path, seg: str, passes: int, repeats: int) -> dict[str, Any]:
    """The training trace, direct and under the interposer as LP: alone on the card (the
    target), then beside an idle high-priority process (the card's window in force), with
    what that window costs an ideal launcher (traces.window_model_ratio)."""
    timeline = directory / "timeline.txt"
    traces.write_timeline(timeline, traces.LP_TRAINING)
    alone = replay_pairs(directory, seg, timeline, passes, repeats)
    alone_stats = replay_stats(directory, seg, timeline, passes)
    two = replay_pairs(directory, seg, timeline, passes, repeats, streams=2)
    two_stats = replay_stats(directory, seg, timeline, passes, streams=2)
    with idle_high_priority(vgpu_env(directory, seg, HP_VGPU)):
        beside_hp = replay_pairs(directory, seg, timeline, passes, repeats)
        beside_hp_stats = replay_stats(directory, seg, timeline, passes)
        gated = replay_pairs(directory, seg, timeline, passes, repeats, DEVICE_GATE)
        gated_stats = replay_stats(directory, seg, timeline, passes, DEVICE_GATE)
    window_ns = DEFAULT_LP_WINDOW_US * 1000
    return {
        "workload": traces.LP_TRAINING,
        "host_scale": traces.HOST_SCALE,
        "passes_per_run": passes,
        "runs": repeats,
        "launches_per_pass": alone[2],
        **replay_figures(*alone, passes),
        "interposer": alone_stats,
        "lp_throughput_ratio_target": 0.97,
        "two_streams": {**replay_figures(*two, passes), "interposer": two_stats},
        "beside_idle_hp": {
            "lp_window_us": DEFAULT_LP_WINDOW_US,
            **replay_figures(*beside_hp, passes),
            "window_model_ratio": traces.window_model_ratio(traces.LP_TRAINING, window_ns),
            "interposer": beside_hp_stats,
        },
        "beside_idle_hp_device_gate": {**replay_figures(*gated, passes), "interposer": gated_stats},
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    build_cuda()
    launches, repeats = (200_000, 3) if args.quick else (2_000_000, 7)
    with tempfile.TemporaryDirectory() as tmp, test_node(Path(tmp), FAKE_UUID, 16 * GIB) as seg:
        directory = Path(tmp)
        replayed = replay(directory, seg, 3 if args.quick else 5, 9 if args.quick else 21)
        direct = ns_per_launch(vgpu_env(directory, seg, None), launches, repeats)
        hp = ns_per_launch(vgpu_env(directory, seg, HP_VGPU), launches, repeats)
        at_once = vgpu_env(directory, seg, HP_VGPU) | {"QSHARE_HP_FENCE_INTERVAL_US": "0"}
        hp_at_once = ns_per_launch(at_once, launches, repeats)
        lp = ns_per_launch(vgpu_env(directory, seg, LP_VGPU), launches, repeats)
        alone = attach_ms(vgpu_env(directory, seg, HP_VGPU), 1, 10 if args.quick else 50)
        crowd = attach_ms(vgpu_env(directory, seg, HP_VGPU), 64, 1 if args.quick else 3)
        allocs = alloc_costs(directory, seg, 20_000 if args.quick else 200_000, repeats)
    return {
        "benchmark": "hook",
        "driver": "fake libcuda.so.1 (test double; kernels of 0 ns complete inline)",
        "launches_per_run": launches,
        "runs": repeats,
        "launches_per_s": {
            "direct": 1e9 / direct,
            "high": 1e9 / hp,
            "high_fence_0": 1e9 / hp_at_once,
            "low": 1e9 / lp,
        },
        "ns_per_launch": {"direct": direct, "high": hp, "high_fence_0": hp_at_once, "low": lp},
        "ns_per_launch_added": {
            "high": hp - direct,
            "high_fence_0": hp_at_once - direct,
            "low": lp - direct,
        },
        "ns_per_launch_added_target": 100,
        "attach_ms": {
            "processes_1": {"p50": percentile(alone, 50), "p99": percentile(alone, 99)},
            "processes_64": {"p50": percentile(crowd, 50), "p99": percentile(crowd, 99)},
        },
        "attach_ms_target": 1.0,
        "attach_ms_by_contexts": attach_scale.measure(quick=args.quick),
        "alloc": allocs,
        "replay": replayed,
    }


def table(result: dict[str, Any]) -> str:
    rate, cost, added = (
        result["launches_per_s"],
        result["ns_per_launch"],
        result["ns_per_launch_added"],
    )
    lines = [
        f"hook bench — {result['driver']}",
        f"{'path':<28}{'launches/s':>14}{'ns/launch':>12}{'added ns':>10}",
        f"{'direct to the fake driver':<28}{rate['direct']:>14,.0f}{cost['direct']:>12.1f}{'':>10}",
    ]
    paths = (("high", "high priority"), ("high_fence_0", "HP, unpaced"))
    for prio, name in (*paths, ("low", "low priority")):
        if prio not in rate:  # results from before the paced row
            continue
        label = f"interposed, {name}"[:28]
        lines.append(f"{label:<28}{rate[prio]:>14,.0f}{cost[prio]:>12.1f}{added[prio]:>10.1f}")
    lines.append(f"target added ns/launch (uncontended): <= {result['ns_per_launch_added_target']}")
    for key, label in (("processes_1", "1 process"), ("processes_64", "64 processes")):
        a = result["attach_ms"][key]
        lines.append(f"attach, {label:<13} p50 {a['p50']:.3f} ms   p99 {a['p99']:.3f} ms")
    lines += attach_scale.table_lines(result["attach_ms_by_contexts"])
    for kind, cost in result.get("alloc", {}).get("ns_per_pair", {}).items():
        lines.append(
            f"allocate 1 MiB and free, {kind:<6} direct {cost['direct']:8.0f} ns  interposed "
            f"{cost['interposed']:8.0f} ns  added {cost['added']:6.0f} ns"
        )
    r = result["replay"]
    lines.append(
        f"replay {r['workload']} ({r['runs']} runs of {r['passes_per_run']} passes of "
        f"{r['launches_per_pass']} launches, host gaps x{r['host_scale']})"
    )
    rows = [("LP alone on the card", r)]
    if "two_streams" in r:
        rows.append(("... over 2 streams", r["two_streams"]))
    rows.append(("LP beside an idle HP", r["beside_idle_hp"]))
    if "beside_idle_hp_device_gate" in r:
        rows.append(("... with device gate", r["beside_idle_hp_device_gate"]))
    for label, row in rows:
        runs = row["lp_throughput_ratio_runs"]
        lines.append(
            f"  {label:<22} direct {row['wall_ms']['direct']:8.1f} ms  interposed "
            f"{row['wall_ms']['interposed']:8.1f} ms  ratio {row['lp_throughput_ratio']:.3f} "
            f"[{runs['min']:.3f}..{runs['max']:.3f}]  "
            f"added {row['ns_per_launch_added']:.0f} ns/launch"
        )
        if "interposer" in row:
            lines.append(f"    {stats_line(row['interposer'])}")
    b = r["beside_idle_hp"]
    lines.append(
        f"  target ratio (alone) >= {r['lp_throughput_ratio_target']}; a {b['lp_window_us']} us "
        f"window costs an ideal launcher {1 - b['window_model_ratio']:.1%}"
    )
    return "\n".join(lines)


def stats_line(s: dict[str, Any]) -> str:
    """One line of the interposer's statistics: paths, fences, window waits, ns per launch."""
    paths = ", ".join(f"{k} {v}" for k, v in s["launches"].items() if v and k != "total")
    fences = s["lp_fences_by_launch"] + s["lp_fences_by_tail"] + s["lp_fence_markers"]
    own = s["ns_per_launch"]["interposer"]
    return (
        f"launches: {paths}; LP fences {fences}, device gate waits "
        f"{s.get('lp_device_gate_waits', 0)}, window waits {s['lp_window_waits']} "
        f"({s['lp_window_wait_ns'] / 1e6:.1f} ms); interposer ns/launch p50 {own['p50']:.0f} "
        f"mean {own['mean']:.0f}"
    )
