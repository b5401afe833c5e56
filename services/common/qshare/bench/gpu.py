"""`qshare bench gpu`: online/offline co-location on a real NVIDIA GPU with PyTorch.

High priority (HP) serves batch-1 inference requests at Poisson arrivals: ResNet-50 as one
CUDA graph (how latency-critical inference is usually served), ResNet-50 eager (host-bound,
many sub-millisecond device gaps per request) or a BERT-base-shaped encoder. Low priority
(LP) trains ResNet-50 (batch 64) or a GPT-2-shaped model (124M, kernels up to ms long).
Each scenario (alone, co-located without qshare, under MPS with LP at client priority 1,
under qshare at release 100 ms, 1 ms or auto) runs three times, rounds interleaved, and is
reported as median and spread. Reports HP latency p50/p99, LP throughput, the harvest (LP
throughput ÷ LP alone × the share of time HP leaves the card idle) and the targets of issue
9; plots HP latency and LP throughput side by side. Needs a GPU and PyTorch; CI never runs
it (`qshare bench hook` replays the same workloads through the fake driver).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qshare.bench import gpu_plot, gpu_pooled, traces
from qshare.bench.stats import percentile
from qshare.bench.testnode import HP_VGPU, LP_VGPU, test_node
from qshare.gpu_timeslice import set_timeslice
from qshare.native_build import INTERPOSER, build_cuda

HP_RATE_PER_S = 30.0
AUTO_BOUND_US = 2000  # auto release: HP p99 may grow by at most this much
ROUNDS = 3
LP_BATCH = {"resnet50": 64, "gpt2": 8, "resnet50_2s": 64}


# ---- workers: run as `python -m qshare.bench.gpu ROLE KIND SECONDS OUT` in their own process ----


def _resnet50_infer(graph: bool) -> Any:
    import torch  # type: ignore[import-not-found, unused-ignore]
    import torchvision  # type: ignore[import-not-found, unused-ignore]

    model = torchvision.models.resnet50().cuda().half().eval()
    x = torch.randn(1, 3, 224, 224, device="cuda", dtype=torch.half)
    with torch.inference_mode():
        for _ in range(20):
            model(x)
        torch.cuda.synchronize()
        if not graph:
            return lambda: model(x)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            model(x)
    return g.replay


def _bert_infer() -> Any:
    import torch  # type: ignore[import-not-found, unused-ignore]

    layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False).cuda().half().eval()
    x = torch.randn(1, 128, 768, device="cuda", dtype=torch.half)
    with torch.inference_mode():
        for _ in range(20):
            model(x)
    torch.cuda.synchronize()
    return lambda: model(x)


def _hp_worker(kind: str, seconds: float, out: Path) -> None:
    import random

    import torch  # type: ignore[import-not-found, unused-ignore]

    request = _bert_infer() if kind == "bert" else _resnet50_infer(kind == "graph")
    _ready_then_go(out)
    latencies: list[float] = []
    device_ms = 0.0
    rng = random.Random(7)
    with torch.inference_mode():
        start = time.perf_counter()
        arrival = start
        while arrival - start < seconds:
            arrival += rng.expovariate(HP_RATE_PER_S)
            if (delay := arrival - time.perf_counter()) > 0:
                time.sleep(delay)
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            request()
            end.record()
            end.synchronize()
            latencies.append((time.perf_counter() - arrival) * 1e3)
            device_ms += begin.elapsed_time(end)
        wall = time.perf_counter() - start
    out.write_text(json.dumps({"latency_ms": latencies, "busy_share": device_ms / 1e3 / wall}))


def _ready_then_go(out: Path, timeout_s: float = 300.0) -> None:
    """Say the model is warm, then wait for the start signal: the workers of a scenario
    warm up together and measure the same seconds."""
    out.with_suffix(".ready").write_text("1")
    deadline = time.monotonic() + timeout_s
    while not out.with_suffix(".go").exists():
        if time.monotonic() > deadline:
            raise SystemExit("no start signal")
        time.sleep(0.005)


def _resnet50_step() -> Any:
    import torch  # type: ignore[import-not-found, unused-ignore]
    import torchvision  # type: ignore[import-not-found, unused-ignore]

    model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (64,), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def _gpt2_step() -> Any:
    import torch  # type: ignore[import-not-found, unused-ignore]

    vocab, seq, width = 50257, 512, 768
    layer = torch.nn.TransformerEncoderLayer(
        width, 12, 4 * width, batch_first=True, norm_first=True
    )
    body = torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False)
    model = torch.nn.ModuleDict(
        {
            "tok": torch.nn.Embedding(vocab, width),
            "pos": torch.nn.Embedding(seq, width),
            "body": body,
            "head": torch.nn.Linear(width, vocab, bias=False),
        }
    ).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, vocab, (8, seq), device="cuda")
    mask = torch.nn.Transformer.generate_square_subsequent_mask(seq, device="cuda")
    pos = torch.arange(seq, device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h = model["body"](model["tok"](ids) + model["pos"](pos), mask=mask, is_causal=True)
            logits = model["head"](h)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), ids.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def _with_side_stream(step: Any) -> Any:
    """`step` with one long GEMM a step on a stream of its own beside it (as a communication
    or prefetch stream runs beside a model's): two streams whose kernels differ in length by
    ~200x, what the interposer's per-stream hold is for."""
    import torch  # type: ignore[import-not-found, unused-ignore]

    side = torch.cuda.Stream()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)  # ~1.5 ms on an H100

    def both() -> None:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.mm(a, a)
        step()
        torch.cuda.current_stream().wait_stream(side)

    return both


def _lp_step(kind: str) -> Any:
    if kind == "gpt2":
        return _gpt2_step()
    if kind == "resnet50_2s":
        return _with_side_stream(_resnet50_step())
    return _resnet50_step()


def _lp_worker(kind: str, seconds: float, out: Path) -> None:
    import torch  # type: ignore[import-not-found, unused-ignore]

    step = _lp_step(kind)
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    _ready_then_go(out)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        steps += 1
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    out.write_text(json.dumps({"items_per_s": steps * LP_BATCH[kind] / elapsed, "steps": steps}))


def _launch_worker(kind: str, seconds: float, out: Path) -> None:
    import torch  # type: ignore[import-not-found, unused-ignore]

    del kind
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


# ---- scenarios ----


@dataclass(frozen=True)
class Scenario:
    name: str
    hp: str | None  # graph | eager | bert
    lp: str | None  # resnet50 | gpt2 | resnet50_2s (with a side stream of long GEMMs)
    mode: str  # plain | qshare-100ms | qshare-1ms | qshare-auto
    mps: bool = False  # under MPS, LP at client priority 1
    window_us: int | None = None  # the card's LP window (None: the driver's default)
    hp_fence_us: int | None = None  # QSHARE_HP_FENCE_INTERVAL_US for the HP process
    stats: bool = False  # workers write the interposer's statistics (QSHARE_STATS_FILE)
    device_gate: bool = False  # LP's queued work waits on the gate word on the device
    timeslice: str | None = None  # the card's timeslice between contexts for the run (root)
    lp_sm_percent: int | None = None  # under MPS, LP's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE


MPS_LP_SM_PERCENT = 80
"""LP's share of the SMs in the `_mps_sm80` rows: HP keeps a fifth of the card's SMs."""


def _mps_sm(name: str, hp: str | None, lp: str, mode: str) -> Scenario:
    """The row `name` under MPS with LP at client priority 1 and MPS_LP_SM_PERCENT of the
    SMs (`graph+lp_qshare_1ms` becomes `graph+lp_qshare_1ms_mps_sm80`)."""
    named = f"{name}_mps_sm{MPS_LP_SM_PERCENT}"
    return Scenario(named, hp, lp, mode, mps=True, lp_sm_percent=MPS_LP_SM_PERCENT)


MPS_SM_ROWS = (  # (row, HP, LP, mode) run again with LP kept off part of the SMs
    ("lp_alone", None, "resnet50", "plain"), ("gpt2_alone", None, "gpt2", "plain"),
    ("graph+lp", "graph", "resnet50", "plain"), ("graph+gpt2", "graph", "gpt2", "plain"),
    ("graph+lp_qshare_1ms", "graph", "resnet50", "qshare-1ms"),
    ("graph+gpt2_qshare_1ms", "graph", "gpt2", "qshare-1ms"),
)  # fmt: skip

SCENARIOS = (
    Scenario("lp_alone", None, "resnet50", "plain"),
    Scenario("lp_alone_qshare", None, "resnet50", "qshare-100ms"),
    Scenario("graph_alone", "graph", None, "plain"),
    Scenario("graph+lp_plain", "graph", "resnet50", "plain"),
    Scenario("graph+lp_mps", "graph", "resnet50", "plain", mps=True),
    Scenario("graph+lp_qshare_100ms", "graph", "resnet50", "qshare-100ms"),
    Scenario("graph+lp_qshare_1ms", "graph", "resnet50", "qshare-1ms"),
    Scenario("eager_alone", "eager", None, "plain"),
    Scenario("eager+lp_plain", "eager", "resnet50", "plain"),
    Scenario("eager+lp_qshare_100ms", "eager", "resnet50", "qshare-100ms"),
    Scenario("eager+lp_qshare_auto", "eager", "resnet50", "qshare-auto"),
    Scenario("bert_alone", "bert", None, "plain"),
    Scenario("bert+lp_qshare_1ms", "bert", "resnet50", "qshare-1ms"),
    Scenario("gpt2_alone", None, "gpt2", "plain"),
    Scenario("graph+gpt2_plain", "graph", "gpt2", "plain"),
    Scenario("graph+gpt2_qshare_1ms", "graph", "gpt2", "qshare-1ms"),
)

# Run only when `--only` names them: the window's trade-off and qshare's gate under MPS.
EXTRA_SCENARIOS = (
    Scenario("graph+lp_qshare_1ms_w100", "graph", "resnet50", "qshare-1ms", window_us=100),
    Scenario("graph+lp_qshare_1ms_w200", "graph", "resnet50", "qshare-1ms", window_us=200),
    Scenario("graph+lp_qshare_1ms_w2000", "graph", "resnet50", "qshare-1ms", window_us=2000),
    Scenario("graph+lp_qshare_mps_1ms", "graph", "resnet50", "qshare-1ms", mps=True),
    Scenario(
        "graph+lp_qshare_mps_1ms_w2000", "graph", "resnet50", "qshare-1ms", mps=True, window_us=2000
    ),
    Scenario("graph+gpt2_qshare_1ms_w100", "graph", "gpt2", "qshare-1ms", window_us=100),
    # `auto` beside a CUDA-graph HP (one launch, one gap a request): what the card model
    # predicts since auto's warm-up counts the gaps seen (docs/colocation.md)
    Scenario("graph+lp_qshare_auto", "graph", "resnet50", "qshare-auto"),
    Scenario("resnet50_2s_alone", None, "resnet50_2s", "plain"),
    Scenario("lp2s_alone_qshare", None, "resnet50_2s", "qshare-100ms"),
    Scenario("graph+lp2s_plain", "graph", "resnet50_2s", "plain"),
    Scenario("graph+lp2s_qshare_1ms", "graph", "resnet50_2s", "qshare-1ms"),
    Scenario("graph+gpt2_qshare_mps_1ms", "graph", "gpt2", "qshare-1ms", mps=True),
    # Part of the SMs kept from LP under MPS (its active thread percentage): HP's kernels
    # start on the SMs LP may not use, beside a long LP kernel instead of behind it.
    *(_mps_sm(*row) for row in MPS_SM_ROWS),
    Scenario("lp_alone_mps", None, "resnet50", "plain", mps=True),
    Scenario("lp_alone_qshare_mps", None, "resnet50", "qshare-100ms", mps=True),
    Scenario("eager_alone_qshare", "eager", None, "qshare-100ms"),
    Scenario("eager_alone_qshare_fence200", "eager", None, "qshare-100ms", hp_fence_us=200),
    # before 2026-11-24's default: HP's fence re-recorded at every completion
    Scenario("eager_alone_qshare_fence0", "eager", None, "qshare-100ms", hp_fence_us=0),
    Scenario(
        "eager+lp_qshare_100ms_fence200", "eager", "resnet50", "qshare-100ms", hp_fence_us=200
    ),
    Scenario("bert+lp_qshare_1ms_fence200", "bert", "resnet50", "qshare-1ms", hp_fence_us=200),
    # Where a launch's time goes on the real driver (the timing costs ~0.1 µs per launch).
    Scenario("lp_alone_qshare_stats", None, "resnet50", "qshare-100ms", stats=True),
    Scenario("eager_alone_qshare_stats", "eager", None, "qshare-100ms", stats=True),
    Scenario("graph+lp_qshare_1ms_stats", "graph", "resnet50", "qshare-1ms", stats=True),
    # LP's device gate (QSHARE_LP_DEVICE_GATE=1): HP should wait for a 100 µs slice of LP's
    # queue, not its window, and LP keep the deep window beside HP.
    # The card's timeslice set SHORT for the run (nvidia-smi compute-policy, root): what
    # `qshare bench model` predicts bounds what HP waits behind a long LP kernel.
    *(
        Scenario(f"{name}_ts_short", "graph", lp, mode, timeslice="short")
        for name, lp, mode in (
            ("graph+lp_plain", "resnet50", "plain"),
            ("graph+lp_qshare_1ms", "resnet50", "qshare-1ms"),
            ("graph+gpt2_plain", "gpt2", "plain"),
            ("graph+gpt2_qshare_1ms", "gpt2", "qshare-1ms"),
        )
    ),
    *(
        Scenario(f"{name}_devgate", hp, lp, mode, device_gate=True, stats=True)
        for name, hp, lp, mode in (
            ("lp_alone_qshare", None, "resnet50", "qshare-100ms"),
            ("graph+lp_qshare_100ms", "graph", "resnet50", "qshare-100ms"),
            ("graph+lp_qshare_1ms", "graph", "resnet50", "qshare-1ms"),
            ("bert+lp_qshare_1ms", "bert", "resnet50", "qshare-1ms"),
            ("graph+gpt2_qshare_1ms", "graph", "gpt2", "qshare-1ms"),
        )
    ),
)


def _spawn(
    role: str, kind: str, seconds: float, out: Path, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "qshare.bench.gpu", role, kind, str(seconds), str(out)]
    return subprocess.Popen(argv, env=env)


def _env(
    vgpu: int | None, seg: str, shm: Path, mps_low: bool, fence_us: int | None = None
) -> dict[str, str]:
    """A worker's environment: on the vGPU (none: plain), LP at MPS priority 1, HP's fence
    interval."""
    env = dict(os.environ)
    if vgpu is not None:
        env.update(QSHARE_VGPU=str(vgpu), QSHARE_SEGMENT=seg, QSHARE_SHM_DIR=str(shm))
        env["LD_PRELOAD"] = str(INTERPOSER)
    if mps_low:
        env["CUDA_MPS_CLIENT_PRIORITY"] = "1"
    if fence_us is not None:
        env["QSHARE_HP_FENCE_INTERVAL_US"] = str(fence_us)
    return env


@contextmanager
def _segment(tmp: Path, sc: Scenario, uuid: str, total: int) -> Iterator[str | None]:
    """The node for the scenario: a test node at its release and window, or none (plain)."""
    if not sc.mode.startswith("qshare"):
        yield None
        return
    auto = AUTO_BOUND_US if sc.mode == "qshare-auto" else None
    delay_ms = 1 if sc.mode == "qshare-1ms" else 100
    with test_node(tmp, uuid, total, delay_ms, auto, sc.window_us) as seg:
        yield seg


Worker = tuple[str, subprocess.Popen[bytes], Path]  # role, process, its result file


def _wait_ready(procs: list[Worker], timeout_s: float) -> None:
    """Until every worker is warm (or has died, or the time is up)."""
    deadline = time.monotonic() + timeout_s
    for _, proc, out in procs:
        while not out.with_suffix(".ready").exists() and proc.poll() is None:
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)


def worker_env(sc: Scenario, role: str, vgpu: int, seg: str | None, out: Path) -> dict[str, str]:
    """The environment of the scenario's `role` worker writing to `out`: on its vGPU under
    qshare (`seg`), else plain; statistics, where the scenario asks, beside `out`."""
    fence = sc.hp_fence_us if role == "hp" else None
    env = _env(vgpu if seg else None, seg or "", out.parent, sc.mps and role == "lp", fence)
    if sc.stats and seg:
        env["QSHARE_STATS_FILE"] = str(out.with_suffix(".stats.json"))
    if sc.device_gate and seg and role == "lp":
        env["QSHARE_LP_DEVICE_GATE"] = "1"
    if sc.lp_sm_percent is not None and role == "lp":
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(sc.lp_sm_percent)
    return env


def _start(sc: Scenario, tmp: Path, seg: str | None, seconds: float) -> list[Worker]:
    """The scenario's workers, warmed up together, then started at one signal."""
    procs: list[Worker] = []
    for role, kind, vgpu in (("lp", sc.lp, LP_VGPU), ("hp", sc.hp, HP_VGPU)):
        if kind is None:
            continue
        out = tmp / f"{role}-{time.monotonic_ns()}.json"
        env = worker_env(sc, role, vgpu, seg, out)
        run_s = seconds + (1.0 if role == "lp" and sc.hp else 0.0)  # LP outlasts HP's run
        procs.append((role, _spawn(role, kind, run_s, out, env), out))
    _wait_ready(procs, 240.0)
    for _, _, out in procs:
        out.with_suffix(".go").write_text("1")
    return procs


def _run_once(tmp: Path, sc: Scenario, seconds: float, uuid: str, total: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    with _segment(tmp, sc, uuid, total) as seg:
        for role, proc, out in _start(sc, tmp, seg, seconds):
            if proc.wait(timeout=600) != 0 or not out.exists():
                result[f"{role}_error"] = f"exit status {proc.returncode}"
                continue
            result.update(_figures(role, json.loads(out.read_text())))
            if (stats := out.with_suffix(".stats.json")).exists():
                result[f"{role}_interposer"] = json.loads(stats.read_text())
    return result


def _figures(role: str, data: dict[str, Any]) -> dict[str, Any]:
    if role == "lp":
        return {"lp_items_per_s": data["items_per_s"]}
    lat = data["latency_ms"]
    return {
        "hp_p50_ms": percentile(lat, 50),
        "hp_p99_ms": percentile(lat, 99),
        "hp_requests": len(lat),
        "hp_busy_share": data["busy_share"],
        gpu_pooled.LATENCIES: [round(x, 4) for x in lat],  # pooled over runs at the merge
    }


# ---- MPS ----


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


@contextmanager
def _mps(tmp: Path) -> Iterator[bool]:
    """MPS running for the block (os.environ pointing at it); False if it cannot start."""
    env = _start_mps(tmp)
    if env is None:
        yield False
        return
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        yield True
    finally:
        os.environ.clear()
        os.environ.update(saved)
        _stop_mps(env)


# ---- orchestration and figures ----


def _gpu_identity() -> tuple[str, str, int]:
    query = "--query-gpu=name,uuid,memory.total"
    try:
        line = subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError) as error:
        raise SystemExit(
            f"qshare bench gpu needs an NVIDIA GPU and its nvidia-smi ({error}); "
            "without one, `qshare bench model` predicts these scenarios"
        ) from None
    name, uuid, mib = (part.strip() for part in line.split(","))
    return name, uuid, int(mib) << 20


def _launch_overhead(
    tmp: Path, seconds: float, uuid: str, total: int
) -> tuple[dict[str, float], dict[str, Any]]:
    """ns per tiny PyTorch launch: without qshare, as a high-priority vGPU (its completion
    thread re-fences at most every 200 µs unless set), as one that re-fences at once, and as
    a low-priority vGPU (alone);
    then, apart, both priorities again with the interposer's statistics (where the time goes)."""
    figures: dict[str, float] = {}
    stats: dict[str, Any] = {}
    runs: list[tuple[str, int | None, int | None]] = [
        ("without_qshare", None, None),
        ("with_qshare", HP_VGPU, None),
        ("with_qshare_fence_0", HP_VGPU, 0),
        ("with_qshare_low", LP_VGPU, None),
        ("with_qshare_stats", HP_VGPU, None),
        ("with_qshare_low_stats", LP_VGPU, None),
    ]
    with test_node(tmp, uuid, total, 100) as seg:
        for label, vgpu, fence in runs:
            out = tmp / f"launch-{label}.json"
            env = _env(vgpu, seg, tmp, False, fence)
            if label.endswith("_stats"):
                env["QSHARE_STATS_FILE"] = str(out.with_suffix(".stats.json"))
            proc = _spawn("launch", "-", seconds, out, env)
            if proc.wait(timeout=300) == 0:
                figures[label] = json.loads(out.read_text())["ns_per_launch"]
            if (found := out.with_suffix(".stats.json")).exists():
                stats[label] = json.loads(found.read_text())
    if "without_qshare" in figures:
        for label, key in (("with_qshare", "added"), ("with_qshare_low", "added_low")):
            if label in figures:
                figures[key] = figures[label] - figures["without_qshare"]
    return figures, stats


def _scratch() -> tempfile.TemporaryDirectory[str]:
    """A scenario's directory (segment and results) in /dev/shm where there is one, as the node
    agent keeps its segment: the device gate registers a page of the segment with the GPU, and
    recent Linux kernels may refuse to pin a page of a file on disk for good (not of shm)."""
    shm = Path("/dev/shm")
    usable = shm.is_dir() and os.access(shm, os.W_OK)
    return tempfile.TemporaryDirectory(prefix="qshare-gpu-", dir=shm if usable else None)


@dataclass(frozen=True)
class Card:
    """The GPU the scenarios run on, as nvidia-smi names it."""

    name: str
    uuid: str
    total: int


def _rounds(
    seconds: float, card: Card, rounds: int, chosen: tuple[Scenario, ...], partial: Path
) -> dict[str, list[dict[str, Any]]]:
    """Every chosen scenario `rounds` times, one round after the other (interleaved); the
    runs so far are in `partial` after each one, so a lease that ends early keeps them."""
    runs: dict[str, list[dict[str, Any]]] = {sc.name: [] for sc in chosen}
    for _ in range(rounds):
        for sc in chosen:
            runs[sc.name].append(_scenario_run(sc, seconds, card))
            write_partial(partial, card.name, seconds, runs)
    return runs


def _set_timeslice(uuid: str, level: str) -> str | None:
    """Set it (qshare.gpu_timeslice); the reason it was not set, or None."""
    return set_timeslice("nvidia-smi", [uuid], level, timeout_s=30)[0].error


@contextmanager
def _timeslice(card: Card, level: str | None) -> Iterator[str | None]:
    """The card at the scenario's timeslice for the run, back at the default after it; yields
    why it could not be set (the run is then skipped: its row would be mislabelled)."""
    if level is None:
        yield None
        return
    error = _set_timeslice(card.uuid, level)
    try:
        yield error
    finally:
        if error is None:
            _set_timeslice(card.uuid, "default")


def _scenario_run(sc: Scenario, seconds: float, card: Card) -> dict[str, Any]:
    with _timeslice(card, sc.timeslice) as refused:
        if refused is not None:
            return {"error": f"timeslice {sc.timeslice} not set: {refused}"}
        return _scenario_run_at(sc, seconds, card)


def _scenario_run_at(sc: Scenario, seconds: float, card: Card) -> dict[str, Any]:
    with _scratch() as t:
        if not sc.mps:
            return _run_once(Path(t), sc, seconds, card.uuid, card.total)
        with _mps(Path(t)) as ok:
            if not ok:
                return {"error": "nvidia-cuda-mps-control not available or failed"}
            return _run_once(Path(t), sc, seconds, card.uuid, card.total)


def write_partial(
    path: Path, gpu: str, seconds: float, runs: dict[str, list[dict[str, Any]]]
) -> None:
    """The runs so far, in the shape `--merge` reads (written whole, then renamed)."""
    done = {name: r for name, r in runs.items() if r}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"gpu": gpu, "seconds_per_scenario": seconds, "raw": done}))
    tmp.replace(path)


# Named sets for `--only @NAME`, a lease each: what the device gate and the statistics need
# measured against their baselines on a GPU.
SETS = {
    "devgate": (
        "lp_alone", "lp_alone_qshare", "lp_alone_qshare_stats", "lp_alone_qshare_devgate",
        "graph_alone", "graph+lp_qshare_100ms", "graph+lp_qshare_100ms_devgate",
        "graph+lp_qshare_1ms", "graph+lp_qshare_1ms_devgate", "graph+lp_qshare_1ms_stats",
    ),
    "diagnose": (
        "bert_alone", "bert+lp_qshare_1ms_devgate", "gpt2_alone", "graph+gpt2_qshare_1ms_devgate",
        "eager_alone", "eager_alone_qshare", "eager_alone_qshare_fence0",
        "eager_alone_qshare_stats",
    ),
    # LP in two streams of kernels ~200x apart in length: each stream held at its own hold
    "streams": (
        "resnet50_2s_alone", "lp2s_alone_qshare", "graph_alone", "graph+lp2s_plain",
        "graph+lp2s_qshare_1ms",
    ),
    # what issue 9's targets read (`targets()`), nothing else
    "targets": (
        "lp_alone", "lp_alone_qshare", "graph_alone", "graph+lp_qshare_100ms",
        "graph+lp_qshare_1ms", "gpt2_alone", "graph+gpt2_qshare_1ms", "eager_alone",
        "eager+lp_qshare_100ms", "eager+lp_qshare_auto",
    ),
    # the card's timeslice SHORT against the driver's default, beside GPT-2's long kernels
    "timeslice": (
        "graph_alone", "lp_alone", "gpt2_alone", "graph+gpt2_plain", "graph+gpt2_plain_ts_short",
        "graph+gpt2_qshare_1ms", "graph+gpt2_qshare_1ms_ts_short", "graph+lp_qshare_1ms",
        "graph+lp_qshare_1ms_ts_short", "graph+lp_plain_ts_short",
    ),
    # `auto` beside the graph HP and the eager HP, against the fixed delays
    "auto": (
        "lp_alone", "graph_alone", "graph+lp_qshare_1ms", "graph+lp_qshare_auto", "eager_alone",
        "eager+lp_qshare_100ms", "eager+lp_qshare_auto",
    ),
    # the graph HP's 1 ms and 100 ms targets, with and without the device gate: five rows to
    # run long (`--seconds 60` and more), since a x1.05 p99 verdict needs thousands of
    # requests a side (gpu_pooled; README)
    "decide": (
        "graph_alone", "graph+lp_qshare_1ms", "graph+lp_qshare_1ms_devgate",
        "graph+lp_qshare_100ms", "graph+lp_qshare_100ms_devgate",
    ),
    # LP kept off a fifth of the SMs under MPS, beside the graph HP: does HP then start
    # beside GPT-2's long kernels instead of behind them (the target the window cannot meet)
    "mpssm": (
        "graph_alone", "lp_alone", "gpt2_alone", "lp_alone_mps", "lp_alone_mps_sm80",
        "gpt2_alone_mps_sm80", "graph+lp_mps_sm80", "graph+gpt2_mps_sm80",
        "graph+lp_qshare_1ms_mps_sm80", "graph+gpt2_qshare_1ms_mps_sm80",
    ),
    # eager HP alone under the interposer, by how often its completion is fenced (the default
    # is 200 µs since 2026-11-24; fence0 is the default before)
    "eagerhp": ("eager_alone", "eager_alone_qshare", "eager_alone_qshare_fence0"),
    # what the gate's waiters no longer taking a wake-up per HP completion should move
    "gatewake": (
        "eager_alone", "eager+lp_qshare_100ms", "eager+lp_qshare_auto",
        "graph_alone", "graph+lp_qshare_1ms",
    ),
}  # fmt: skip


def _by_name() -> dict[str, Scenario]:
    return {sc.name: sc for sc in (*SCENARIOS, *EXTRA_SCENARIOS)}


def scenario(name: str) -> Scenario:
    """The scenario of that name (a KeyError naming it when there is none)."""
    return _by_name()[name]


def chosen_scenarios(only: str | None) -> tuple[Scenario, ...]:
    """The scenarios `--only` names (all when None), or a named set (`@devgate`); an unknown
    name or set is an error naming it."""
    if not only:
        return SCENARIOS
    if only.startswith("@"):
        if only[1:] not in SETS:
            raise SystemExit(f"qshare bench gpu: unknown set {only!r}; known: {sorted(SETS)}")
        only = ",".join(SETS[only[1:]])
    names = [n.strip() for n in only.split(",") if n.strip()]
    known = _by_name()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"qshare bench gpu: unknown scenario(s) {unknown}; known: {sorted(known)}")
    return tuple(known[n] for n in names)


def merge_raw(results: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The raw runs of several earlier results on one GPU, in SCENARIOS order."""
    gpus = {r.get("gpu") for r in results}
    if len(gpus) != 1:
        raise SystemExit(
            f"qshare bench gpu --merge: results from different GPUs {sorted(map(str, gpus))}"
        )
    merged: dict[str, list[dict[str, Any]]] = {sc.name: [] for sc in SCENARIOS}
    for r in results:
        for name, runs in r.get("raw", {}).items():
            merged.setdefault(name, []).extend(runs)
    return {n: runs for n, runs in merged.items() if runs}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and spread (min, max) of each figure over the runs that produced it."""
    out: dict[str, Any] = {"runs": len(runs)}
    keys = sorted({k for r in runs for k, v in r.items() if isinstance(v, int | float)})
    for key in keys:
        values = [float(r[key]) for r in runs if key in r]
        out[key] = statistics.median(values)
        out[f"{key}_spread"] = [min(values), max(values)]
    for key in sorted({k for r in runs for k, v in r.items() if isinstance(v, dict)}):
        out[key] = next(r[key] for r in runs if key in r)  # the first run's, as it was
    errors = [r[k] for r in runs for k in r if k.endswith("error")]
    if errors:
        out["errors"] = errors
    return out


def add_derived(scenarios: dict[str, dict[str, Any]]) -> None:
    """Against the same workload alone: HP p99 added and its ratio, LP throughput's ratio,
    and the harvest: LP throughput ÷ (LP alone × the share of time HP leaves idle, as HP
    alone measured it)."""
    by = _by_name()
    for name, s in scenarios.items():
        sc = by.get(name)
        if sc is None:
            continue
        hp_alone = scenarios.get(f"{sc.hp}_alone", {}) if sc.hp else {}
        lp_alone = scenarios.get("lp_alone" if sc.lp == "resnet50" else f"{sc.lp}_alone", {})
        if "hp_p99_ms" in hp_alone and "hp_p99_ms" in s:
            s["hp_p99_added_ms"] = s["hp_p99_ms"] - hp_alone["hp_p99_ms"]
            s["hp_p99_ratio"] = s["hp_p99_ms"] / hp_alone["hp_p99_ms"]
        if sc.lp and "lp_items_per_s" in s and "lp_items_per_s" in lp_alone:
            s["lp_ratio"] = s["lp_items_per_s"] / lp_alone["lp_items_per_s"]
            if sc.hp:
                idle = 1.0 - float(hp_alone.get("hp_busy_share", 0.0))
                s["harvest"] = s["lp_ratio"] / idle


def add_pooled(scenarios: dict[str, dict[str, Any]], raw: dict[str, list[dict[str, Any]]]) -> None:
    """Each scenario's HP requests pooled over its runs, and beside HP alone's: the ratio and
    the added p99 with their intervals, and whether p99 is within 5 % of alone."""
    by = _by_name()
    for name, s in scenarios.items():
        s.update(gpu_pooled.pooled(raw[name]))
        sc = by.get(name)
        alone = raw.get(f"{sc.hp}_alone", []) if sc is not None and sc.hp else []
        beside = gpu_pooled.against_alone(raw[name], alone) if sc and sc.lp and alone else {}
        if beside:  # both kept their requests (earlier runs did not)
            s.update(beside)
            s["hp_p99_within_5pct"] = gpu_pooled.verdict(beside["hp_p99_pooled_ratio_ci90"], 1.05)


def _gpt2_kernel_ms() -> float:
    """GPT-2's p99 kernel in the H100 trace: what the GPT-2 target lets HP's p99 add."""
    return float(traces.summary(traces.LP_GPT2)["kernel_us_p99"]) / 1e3


def targets(scenarios: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Issue 9's targets, judged on the medians (None where a figure is missing)."""

    def fig(name: str, key: str) -> float | None:
        v = scenarios.get(name, {}).get(key)
        return None if v is None else float(v)

    def le(a: float | None, b: float | None) -> bool | None:
        return None if a is None or b is None else a <= b

    graph, eager = fig("graph_alone", "hp_p99_ms"), fig("eager+lp_qshare_100ms", "hp_p99_ms")
    lp, lp_q = fig("lp_alone", "lp_items_per_s"), fig("lp_alone_qshare", "lp_items_per_s")
    bound = None if graph is None else graph * 1.05
    gpt2_kernel_ms = _gpt2_kernel_ms()
    harvest = fig("graph+lp_qshare_1ms", "harvest")
    auto_lp = fig("eager+lp_qshare_auto", "lp_items_per_s")
    fixed_lp = fig("eager+lp_qshare_100ms", "lp_items_per_s")
    return {
        "lp_alone_qshare_ratio": None if not lp or lp_q is None else lp_q / lp,
        "lp_alone_qshare_ratio_met": None if not lp or lp_q is None else lp_q / lp >= 0.97,
        "graph_1ms_hp_p99_met": le(fig("graph+lp_qshare_1ms", "hp_p99_ms"), bound),
        "graph_1ms_harvest_met": None if harvest is None else harvest >= 0.9,
        "graph_100ms_hp_p99_met": le(fig("graph+lp_qshare_100ms", "hp_p99_ms"), bound),
        "gpt2_hp_p99_met": le(
            fig("graph+gpt2_qshare_1ms", "hp_p99_ms"),
            None if graph is None else graph + gpt2_kernel_ms,
        ),
        "eager_auto_hp_p99_met": le(fig("eager+lp_qshare_auto", "hp_p99_ms"), eager),
        "eager_auto_lp_above_met": None
        if auto_lp is None or fixed_lp is None
        else auto_lp > fixed_lp,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    if getattr(args, "merge", None):
        return _merged(args)
    chosen = chosen_scenarios(args.only)
    card = Card(*_gpu_identity())
    build_cuda()
    seconds = args.seconds or (8.0 if args.quick else 20.0)
    rounds = args.rounds or (1 if args.quick else ROUNDS)
    partial = args.out_dir / "gpu-partial.json"
    raw = _rounds(seconds, card, rounds, chosen, partial)
    result = _described(card.name, seconds, rounds, raw)
    with _scratch() as t:
        overhead, stats = _launch_overhead(Path(t), 3.0, card.uuid, card.total)
        result["launch_overhead_ns"], result["launch_interposer"] = overhead, stats
    return plotted(result, args.out_dir)


def plotted(result: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """The result with its plot's path; a plot that fails is named in `plot_error`, never
    allowed to lose figures that took a GPU lease to measure."""
    try:
        result["plot"] = gpu_plot.plot(result, out_dir)
    except Exception as exc:  # any plotting fault: the figures still count
        result["plot"], result["plot_error"] = None, f"{type(exc).__name__}: {exc}"
    return result


def _merged(args: argparse.Namespace) -> dict[str, Any]:
    """`--merge`: one result from the runs of several earlier ones (each a lease's worth)."""
    parts = [json.loads(Path(p).read_text()) for p in args.merge]
    raw = merge_raw(parts)
    rounds = max(len(runs) for runs in raw.values())
    result = _described(parts[0]["gpu"], parts[0]["seconds_per_scenario"], rounds, raw)
    result["merged_from"] = [str(p) for p in args.merge]
    overheads = [p["launch_overhead_ns"] for p in parts if p.get("launch_overhead_ns")]
    result["launch_overhead_ns"] = overheads[-1] if overheads else {}
    result["launch_overhead_ns_runs"] = overheads
    result["launch_interposer"] = next(
        (p["launch_interposer"] for p in reversed(parts) if p.get("launch_interposer")), {}
    )
    return plotted(result, args.out_dir)


def _described(
    gpu: str, seconds: float, rounds: int, raw: dict[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    result: dict[str, Any] = {"benchmark": "gpu", "gpu": gpu, "seconds_per_scenario": seconds}
    result["rounds"] = rounds
    result["hp"] = (
        f"batch-1 inference (ResNet-50 graph/eager fp16, BERT-base), Poisson {HP_RATE_PER_S:g}/s"
    )
    result["lp"] = (
        "training: ResNet-50 batch 64 bf16 SGD (images/s), GPT-2 124M 8x512 AdamW (samples/s)"
    )
    scenarios = {n: summarize(r) for n, r in raw.items()}
    add_derived(scenarios)
    add_pooled(scenarios, raw)
    result["scenarios"] = scenarios
    result["targets"] = targets(scenarios)
    result["targets_pooled"] = gpu_pooled.targets(scenarios, raw, _gpt2_kernel_ms())
    result["raw"] = raw
    return result


def table(result: dict[str, Any]) -> str:
    lines = [f"gpu bench on {result['gpu']} ({result['rounds']} rounds, median [min..max])"]
    lines.append(f"HP: {result['hp']}; LP: {result['lp']}")
    lines.append(
        f"{'scenario':<26}{'HP p50 ms':>10}{'HP p99 ms':>22}{'+p99 ms':>9}"
        f"{'LP /s':>20}{'LP ratio':>9}{'harvest':>9}"
    )
    for name, s in result["scenarios"].items():
        lines.append(
            f"{name:<26}{_cell(s, 'hp_p50_ms', 10)}{_cell(s, 'hp_p99_ms', 22, True)}"
            f"{_cell(s, 'hp_p99_added_ms', 9)}{_cell(s, 'lp_items_per_s', 20, True, '.0f')}"
            f"{_cell(s, 'lp_ratio', 9)}{_cell(s, 'harvest', 9)}"
            + (f"  errors: {s['errors']}" if "errors" in s else "")
        )
    lines.append(f"targets: {result['targets']}")
    lines.append(f"targets on the pooled requests (90 % intervals): {result.get('targets_pooled')}")
    lines.append(f"launch overhead (ns/launch): {result['launch_overhead_ns']}")
    lines.append(f"plot: {result['plot']}")
    return "\n".join(lines)


def _cell(s: dict[str, Any], key: str, width: int, spread: bool = False, spec: str = ".2f") -> str:
    if key not in s:
        return f" {'-':>{width - 1}}"
    text = format(s[key], spec)
    if spread and f"{key}_spread" in s:
        lo, hi = s[f"{key}_spread"]
        text += f" [{format(lo, spec)}..{format(hi, spec)}]"
    return f" {text:>{width - 1}}"


if __name__ == "__main__":
    WORKERS[sys.argv[1]](sys.argv[2], float(sys.argv[3]), Path(sys.argv[4]))
