"""Smoke check on a real GPU (device machine only): PyTorch under the interposer sees
its vGPU's memory limit, is refused beyond it, and computes correctly."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from qshare.bench.hook import HP_VGPU, INTERPOSER, build_native, test_node

CHILD = """
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

build_native()
line = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
                      capture_output=True, text=True, check=True).stdout.split()[0]
with tempfile.TemporaryDirectory() as tmp, test_node(Path(tmp), line, 16 << 30) as seg:
    env = dict(os.environ, QSHARE_VGPU=str(HP_VGPU), QSHARE_SEGMENT=seg, QSHARE_SHM_DIR=tmp,
               LD_PRELOAD=str(INTERPOSER))
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, timeout=300)
    print("child exit status", done.returncode)
