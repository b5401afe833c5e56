"""The driver's C tests, built and run under AddressSanitizer and UBSan."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_c_suite_passes_under_asan_and_ubsan() -> None:
    result = subprocess.run(
        ["make", "-s", "-C", str(ROOT / "native"), "test"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 failed" in result.stdout
