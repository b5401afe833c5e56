"""`qshare bench gpu`: online/offline co-location on a real NVIDIA GPU with PyTorch.

A high-priority ResNet-50 inference loop (batch 1, Poisson arrivals) runs beside a
low-priority ResNet-50 training loop: alone, co-located without qshare, co-located under
the interposer, and each co-location again under MPS with the low-priority client at
CUDA_MPS_CLIENT_PRIORITY=1. Reports HP latency p50/p99, LP throughput, the latency HP
gains over running alone (what preemption leaves), and the per-launch cost of the
interposer on the real driver. Needs a GPU and PyTorch; CI never runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from qshare.bench.hook import HP_VGPU, LP_VGPU, percentile, test_node
from qshare.native_build import INTERPOSER, build_cuda

HP_RATE_PER_S = 30.0


# ---- workers: run as `python -m qshare.bench.gpu ROLE SECONDS OUT` in their own process ----


# auto release mode: let HP p99 grow by at most this much while LP harvests the gaps
AUTO_BOUND_US = 2000


def _hp_worker(seconds: float, out: Path) -> None:
    import random

    import torch  # type: ignore[import-not-found, unused-ignore]
    import torchvision  # type: ignore[import-not-found, unused-ignore]

    model = torchvision.models.resnet50().cuda().half().eval()
    x = torch.randn(1, 3, 224, 224, device="cuda", dtype=torch.half)
    with torch.inference_mode():
        for _ in range(20):
            model(x)
        torch.cuda.synchronize()
        latencies: list[float] = []
        rng = random.Random(7)
        start = time.perf_counter()
        arrival = start
        while arrival - start < seconds:
            arrival += rng.expovariate(HP_RATE_PER_S)
            delay = arrival - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            model(x)
            torch.cuda.synchronize()
            latencies.append((time.perf_counter() - arrival) * 1e3)
    out.write_text(json.dumps({"latency_ms": latencies}))


def _lp_worker(seconds: float, out: Path) -> None:
    import torch  # type: ignore[import-not-found, unused-ignore]
    import torchvision  # type: ignore[import-not-found, unused-ignore]

    model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (64,), device="cuda")
    ready = out.with_suffix(".ready")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    ready.write_text("1")
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        steps += 1
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    out.write_text(json.dumps({"images_per_s": steps * 64 / elapsed, "steps": steps}))


def _launch_worker(seconds: float, out: Path) -> None:
    import torch  # type: ignore[import-not-found, unused-ignore]

    a = torch.ones(16, device="cuda")
    for _ in range(1000):
        a.add_(1)
    torch.cuda.synchronize()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(1000):
            a.add_(1)
        n += 1000
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    out.write_text(json.dumps({"ns_per_launch": elapsed / n * 1e9}))


WORKERS = {"hp": _hp_worker, "lp": _lp_worker, "launch": _launch_worker}


# ---- orchestration ----


def _spawn(role: str, seconds: float, out: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "qshare.bench.gpu", role, str(seconds), str(out)]
    return subprocess.Popen(argv, env=env)


def _env(
    base: dict[str, str], vgpu: int | None, seg: str, shm: Path, mps_low: bool
) -> dict[str, str]:
    env = dict(base)
    if vgpu is not None:
        env.update(QSHARE_VGPU=str(vgpu), QSHARE_SEGMENT=seg, QSHARE_SHM_DIR=str(shm))
        env["LD_PRELOAD"] = str(INTERPOSER)
    if mps_low:
        env["CUDA_MPS_CLIENT_PRIORITY"] = "1"
    return env


def _scenario(
    tmp: Path, seconds: float, hp: bool, lp: bool, qshare: str | None, shm: Path, mps: bool
) -> dict[str, Any]:
    base = dict(os.environ)
    result: dict[str, Any] = {}
    procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []
    if lp:
        out = tmp / f"lp-{time.monotonic_ns()}.json"
        env = _env(base, LP_VGPU if qshare else None, qshare or "", shm, mps)
        procs.append(("lp", _spawn("lp", seconds + (5 if hp else 0), out, env), out))
        deadline = time.monotonic() + 180
        while not out.with_suffix(".ready").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    if hp:
        out = tmp / f"hp-{time.monotonic_ns()}.json"
        env = _env(base, HP_VGPU if qshare else None, qshare or "", shm, False)
        procs.append(("hp", _spawn("hp", seconds, out, env), out))
    for role, proc, out in procs:
        if proc.wait(timeout=600) != 0 or not out.exists():
            result[f"{role}_error"] = f"exit status {proc.returncode}"
            continue
        data = json.loads(out.read_text())
        if role == "hp":
            lat = data["latency_ms"]
            result.update(hp_p50_ms=percentile(lat, 50), hp_p99_ms=percentile(lat, 99))
            result["hp_requests"] = len(lat)
        else:
            result["lp_images_per_s"] = data["images_per_s"]
    return result


def _start_mps(tmp: Path) -> dict[str, str] | None:
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        return None
    env = dict(os.environ)
    env.update(
        CUDA_MPS_PIPE_DIRECTORY=str(tmp / "mps-pipe"), CUDA_MPS_LOG_DIRECTORY=str(tmp / "mps-log")
    )
    for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        Path(env[key]).mkdir(parents=True, exist_ok=True)
    if subprocess.run([control, "-d"], env=env).returncode != 0:
        return None
    return env


def _stop_mps(env: dict[str, str]) -> None:
    control = shutil.which("nvidia-cuda-mps-control")
    if control is not None:
        subprocess.run([control], input=b"quit\n", env=env, timeout=60)


def _gpu_identity() -> tuple[str, str, int]:
    query = "--query-gpu=name,uuid,memory.total"
    line = subprocess.run(
        ["nvidia-smi", query, "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()[0]
    name, uuid, mib = (part.strip() for part in line.split(","))
    return name, uuid, int(mib) << 20


def _launch_overhead(tmp: Path, seconds: float, seg: str, shm: Path) -> dict[str, float]:
    figures: dict[str, float] = {}
    for label, vgpu in (("without_qshare", None), ("with_qshare", HP_VGPU)):
        out = tmp / f"launch-{label}.json"
        proc = _spawn("launch", seconds, out, _env(dict(os.environ), vgpu, seg, shm, False))
        if proc.wait(timeout=300) == 0:
            figures[label] = json.loads(out.read_text())["ns_per_launch"]
    if len(figures) == 2:
        figures["added"] = figures["with_qshare"] - figures["without_qshare"]
    return figures


def run(args: argparse.Namespace) -> dict[str, Any]:
    build_cuda()
    seconds = 8.0 if args.quick else 20.0
    name, uuid, total = _gpu_identity()
    result: dict[str, Any] = {"benchmark": "gpu", "gpu": name, "seconds_per_scenario": seconds}
    result["hp"] = f"ResNet-50 inference, batch 1, fp16, Poisson {HP_RATE_PER_S:g}/s"
    result["lp"] = "ResNet-50 training, batch 64, bf16 autocast, SGD"
    with tempfile.TemporaryDirectory() as t, test_node(Path(t), uuid, total, 100) as seg:
        tmp, shm = Path(t), Path(t)
        scenarios: dict[str, Any] = {
            "hp_alone": _scenario(tmp, seconds, True, False, None, shm, False),
            "lp_alone": _scenario(tmp, seconds, False, True, None, shm, False),
            "colocated_plain": _scenario(tmp, seconds, True, True, None, shm, False),
            "colocated_qshare": _scenario(tmp, seconds, True, True, seg, shm, False),
        }
    with (
        tempfile.TemporaryDirectory() as t,
        test_node(Path(t), uuid, total, 100, release_auto_us=AUTO_BOUND_US) as seg,
    ):
        scenarios["colocated_qshare_auto"] = _scenario(
            Path(t), seconds, True, True, seg, Path(t), False
        )
    with tempfile.TemporaryDirectory() as t, test_node(Path(t), uuid, total, 100) as seg:
        tmp, shm = Path(t), Path(t)
        mps_env = _start_mps(tmp)
        if mps_env is None:
            result["mps"] = "nvidia-cuda-mps-control not available or failed to start"
        else:
            saved = dict(os.environ)
            os.environ.update(mps_env)
            try:
                scenarios["colocated_mps_lp_priority_low"] = _scenario(
                    tmp, seconds, True, True, None, shm, True
                )
                scenarios["colocated_qshare_mps_lp_priority_low"] = _scenario(
                    tmp, seconds, True, True, seg, shm, True
                )
            finally:
                os.environ.clear()
                os.environ.update(saved)
                _stop_mps(mps_env)
        result["launch_overhead_ns"] = _launch_overhead(tmp, 3.0, seg, shm)
    alone = scenarios["hp_alone"].get("hp_p50_ms")
    for figures in scenarios.values():
        if alone is not None and "hp_p50_ms" in figures:
            figures["hp_p50_added_ms"] = figures["hp_p50_ms"] - alone
    result["scenarios"] = scenarios
    _plot(result, args.out_dir)
    return result


def _plot(result: dict[str, Any], out_dir: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = [n for n, s in result["scenarios"].items() if "hp_p50_ms" in s]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    xs = range(len(names))
    p50 = [result["scenarios"][n]["hp_p50_ms"] for n in names]
    p99 = [result["scenarios"][n]["hp_p99_ms"] for n in names]
    ax.bar([x - 0.2 for x in xs], p50, width=0.4, label="HP p50")
    ax.bar([x + 0.2 for x in xs], p99, width=0.4, label="HP p99")
    ax.set_xticks(list(xs), [n.replace("_", "\n", 1) for n in names], fontsize=7)
    ax.set_ylabel("HP request latency (ms)")
    ax.set_title(f"qshare co-location on {result['gpu']}: {result['hp']}")
    ax.legend()
    out_dir.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out_dir / "gpu.png", dpi=120)


def table(result: dict[str, Any]) -> str:
    lines = [f"gpu bench on {result['gpu']} — HP: {result['hp']}; LP: {result['lp']}"]
    lines.append(
        f"{'scenario':<40}{'HP p50 ms':>10}{'HP p99 ms':>10}{'+p50 ms':>9}{'LP img/s':>10}"
    )
    for name, s in result["scenarios"].items():
        cells = [s.get(k) for k in ("hp_p50_ms", "hp_p99_ms", "hp_p50_added_ms", "lp_images_per_s")]
        text = ["-" if c is None else f"{c:.2f}" for c in cells]
        lines.append(f"{name:<40}{text[0]:>10}{text[1]:>10}{text[2]:>9}{text[3]:>10}")
    lines.append(f"launch overhead (ns/launch): {result['launch_overhead_ns']}")
    if "mps" in result:
        lines.append(f"MPS: {result['mps']}")
    return "\n".join(lines)


if __name__ == "__main__":
    WORKERS[sys.argv[1]](float(sys.argv[2]), Path(sys.argv[3]))
