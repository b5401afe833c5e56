"""Where `make native` puts the native artefacts in the source tree, and how to (re)build them."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
BUILD = ROOT / "native" / "build"
INTERPOSER = BUILD / "libqshare-cuda.so"
TOOLS = BUILD / "cuda-tests"  # C programs the CUDA tests and benchmarks run
ASAN_TOOLS = BUILD / "cuda-tests-asan"
FAKE_DIR = BUILD / "fake"  # the fake libcuda.so.1 and NVML: test doubles


def build_cuda(target: str | None = None) -> None:
    """Build the interposer, its test doubles and test programs (or `target` of their Makefile)."""
    argv = ["make", "-s", "-C", str(ROOT / "native" / "cuda")]
    subprocess.run([*argv, target] if target else argv, check=True)
