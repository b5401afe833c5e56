"""A one-card test node (qshare-testnode) with an HP and an LP vGPU, and the environment a
program gets on it: shared by `qshare bench hook` (fake driver) and `qshare bench gpu` (real
GPU), so neither needs more than the standard library and the native build."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from qshare.native_build import FAKE_DIR, INTERPOSER, TOOLS

FAKE_UUID = "GPU-0a1b2c3d-0000-4000-8000-00000000be4c"
HP_VGPU, LP_VGPU = 1, 2


@contextlib.contextmanager
def test_node(
    directory: Path,
    card_uuid: str,
    card_mem: int,
    release_delay_ms: int = 100,
    release_auto_us: int | None = None,
    lp_window_us: int | None = None,
) -> Iterator[str]:
    """A segment with one card, an HP vGPU (id 1) and an LP vGPU (id 2); yields its name.
    With `release_auto_us`, the card's release delay is `auto` with that HP p99 bound."""
    name = f"bench-{os.getpid()}"
    argv = [str(TOOLS / "qshare-testnode"), "--name", name, "--dir", str(directory)]
    argv += ["--release-delay-ms", str(release_delay_ms), "--card", f"{card_uuid}:{card_mem}"]
    if release_auto_us is not None:
        argv += ["--release-auto-us", str(release_auto_us)]
    if lp_window_us is not None:
        argv += ["--lp-window-us", str(lp_window_us)]
    argv += ["--vgpu", f"{HP_VGPU}:0:high:100:{card_mem // 2}"]
    argv += ["--vgpu", f"{LP_VGPU}:0:low:100:{card_mem // 2}"]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError("qshare-testnode did not start")
    try:
        yield name
    finally:
        proc.stdin.write("quit\n")
        proc.stdin.flush()
        proc.stdin.close()
        proc.wait(timeout=30)


def vgpu_env(directory: Path, segment: str, vgpu: int | None) -> dict[str, str]:
    """The environment `qshare run` gives a program, plus the fake driver's path."""
    env = dict(os.environ)
    env.update(QSHARE_SHM_DIR=str(directory), QSHARE_SEGMENT=segment)
    env.update(QSHARE_FAKE_GPU_UUID=FAKE_UUID, LD_LIBRARY_PATH=str(FAKE_DIR))
    if vgpu is not None:
        env.update(QSHARE_VGPU=str(vgpu), LD_PRELOAD=str(INTERPOSER))
    return env
