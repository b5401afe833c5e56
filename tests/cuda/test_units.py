"""Unit tests of single interposer files (native/cuda/tests/unit_*.c), built with
AddressSanitizer and UBSan against stand-ins for the rest of the interposer."""

from __future__ import annotations

import subprocess
from pathlib import Path

from qshare.native_build import ASAN_TOOLS, build_cuda


def test_lp_batch_units_pass(cuda_build: Path) -> None:
    build_cuda("unit")
    done = subprocess.run(
        [str(ASAN_TOOLS / "unit-lp-batch")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_context_units_pass(cuda_build: Path) -> None:
    build_cuda("unit")
    done = subprocess.run(
        [str(ASAN_TOOLS / "unit-context")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_hp_unit_units_pass(cuda_build: Path) -> None:
    build_cuda("unit")
    done = subprocess.run(
        [str(ASAN_TOOLS / "unit-hp-unit")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_tracker_units_pass(cuda_build: Path) -> None:
    build_cuda("unit")
    done = subprocess.run(
        [str(ASAN_TOOLS / "unit-tracker")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
