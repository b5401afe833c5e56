"""Unit tests of single interposer files (native/cuda/tests/unit_*.c), built with
AddressSanitizer and UBSan against stand-ins for the rest of the interposer."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from qshare.native_build import ASAN_TOOLS, build_cuda


@pytest.mark.parametrize(
    "program", ["unit-lp-batch", "unit-context", "unit-hp-unit", "unit-tracker"]
)
def test_every_unit_of_the_program_passes(cuda_build: Path, program: str) -> None:
    build_cuda("unit")
    done = subprocess.run([str(ASAN_TOOLS / program)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
