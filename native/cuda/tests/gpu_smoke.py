"""Smoke check on a real GPU (device machine only; CI never runs it), in well under a minute:
PyTorch under the interposer sees its vGPU's memory limit, is refused beyond it and computes
correctly, with its stream-ordered allocator too (allocate-free-allocate at the limit allowed,
a CUDA graph whose allocation nodes pass the limit refused at instantiation, one within it
replayed correctly); and the low-priority device gate works on this driver: the gate word registers,
waits are enqueued, and a high-priority request beside a deep low-priority queue waits for
a slice of it, not the queue. Run from the repository root:

    PYTHONPATH=services/common python3 native/cuda/tests/gpu_smoke.py
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from qshare.bench.testnode import HP_VGPU, LP_VGPU, test_node
from qshare.native_build import INTERPOSER, build_cuda

MEMORY = """
import torch
free, total = torch.cuda.mem_get_info()
print("mem_get_info total GiB", total / 2**30, "free GiB", free / 2**30)
a = torch.randn(2048, 2048, device="cuda"); b = a @ a.T
ref = (a.double() @ a.double().T)
print("matmul rel err", float((b.double() - ref).norm() / ref.norm()))
try:
    big = torch.empty(int(9 * 2**30), dtype=torch.uint8, device="cuda")
    print("over-limit allocation: NOT refused")
except torch.cuda.OutOfMemoryError:
    print("over-limit allocation: refused with OutOfMemoryError")
"""

# PyTorch's stream-ordered allocator (cudaMallocAsync: memory pools, and graph memory nodes
# when captured) under the vGPU's 8 GiB limit.
ASYNC_MEMORY = """
import torch
print("allocator backend", torch.cuda.memory.get_allocator_backend())
done = 0
try:
    for _ in range(5):
        x = torch.empty(int(6 * 2**30), dtype=torch.uint8, device="cuda"); x.fill_(1); del x
        done += 1
    print("async allocate-free-allocate of 6 GiB: 5 of 5")
except torch.cuda.OutOfMemoryError:
    print("async allocate-free-allocate of 6 GiB: REFUSED after", done)
try:
    big = torch.empty(int(9 * 2**30), dtype=torch.uint8, device="cuda")
    print("async over-limit allocation: NOT refused")
except torch.cuda.OutOfMemoryError:
    print("async over-limit allocation: refused with OutOfMemoryError")
torch.cuda.synchronize()
for gib, name in ((2, "within"), (9, "over")):
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            y = torch.full((int(gib * 2**30),), 3, dtype=torch.uint8, device="cuda")
            s = y[:1024].sum()
        g.replay(); torch.cuda.synchronize()
        print(f"graph allocating {gib} GiB ({name} the limit): replayed, sum {int(s)} (3072)")
    except Exception as error:
        print(f"graph allocating {gib} GiB ({name} the limit): refused,",
              type(error).__name__, str(error)[:160].replace(chr(10), " "))
    del g
    torch.cuda.synchronize()
"""

# Low priority: matmuls of about 1 ms each, queued as deep as the window lets, for `seconds`.
LP = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
for _ in range(3): a @ a
torch.cuda.synchronize()
end = time.monotonic() + float(sys.argv[1])
n = 0
while time.monotonic() < end:
    a @ a; n += 1
torch.cuda.synchronize()
print("lp matmuls", n)
"""

# High priority: small requests at 20/s; the latency of each, launch to completion.
HP = """
import sys, time, torch
x = torch.randn(256, 256, device="cuda", dtype=torch.half)
for _ in range(5): x @ x
torch.cuda.synchronize()
time.sleep(float(sys.argv[1]))  # LP's queue is deep by now
lat = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter(); x @ x; torch.cuda.synchronize()
    lat.append((time.perf_counter() - t) * 1e3); time.sleep(0.05)
lat.sort()
print("hp ms p50 %.3f p99 %.3f" % (lat[len(lat) // 2], lat[int(len(lat) * 0.99)]))
"""


def env_for(seg: str, shm: str, vgpu: int, extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ, QSHARE_VGPU=str(vgpu), QSHARE_SEGMENT=seg, QSHARE_SHM_DIR=shm)
    env["LD_PRELOAD"] = str(INTERPOSER)
    return env | extra


def memory_check(seg: str, shm: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", MEMORY], env=env_for(seg, shm, HP_VGPU, {}), timeout=300
    )
    print("memory check exit status", done.returncode)
    pooled = env_for(seg, shm, HP_VGPU, {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"})
    done = subprocess.run([sys.executable, "-c", ASYNC_MEMORY], env=pooled, timeout=300)
    print("stream-ordered memory check exit status", done.returncode)


def beside_lp(seg: str, shm: str, gate: str) -> None:
    """HP's latency while LP trains, with the device gate `gate` ("1" or "0"); LP's stats."""
    stats = Path(shm) / f"lp-stats-{gate}.json"
    lp_env = env_for(
        seg, shm, LP_VGPU, {"QSHARE_LP_DEVICE_GATE": gate, "QSHARE_STATS_FILE": str(stats)}
    )
    lp = subprocess.Popen([sys.executable, "-c", LP, "8"], env=lp_env)
    time.sleep(1.0)
    hp = subprocess.run(
        [sys.executable, "-c", HP, "2", "60"], env=env_for(seg, shm, HP_VGPU, {}), timeout=300
    )
    lp.wait(timeout=300)
    print(f"device gate {gate}: hp exit {hp.returncode}, lp exit {lp.returncode}")
    if stats.exists():
        s = json.loads(stats.read_text())
        keys = (
            "launches",
            "lp_device_gate_waits",
            "lp_window_ns",
            "lp_window_waits",
            "ns_per_launch",
        )
        print(json.dumps({k: s.get(k) for k in keys}))


def main() -> None:
    build_cuda()
    uuid = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[0]
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None  # the gate word must pin
    with (
        tempfile.TemporaryDirectory(dir=shm) as tmp,
        test_node(Path(tmp), uuid, 16 << 30, release_delay_ms=1) as seg,
    ):
        memory_check(seg, tmp)
        for gate in ("0", "1"):
            beside_lp(seg, tmp, gate)


if __name__ == "__main__":
    main()
