"""The interposer under ThreadSanitizer: the direct-call probe linked to a build of it with
-fsanitize=thread (`make -C native/cuda tsan`), run through the paths where its threads meet:
launches into many streams (batched and one unit per launch; a stream of short kernels beside
one of long ones), from threads that exit, streams and contexts destroyed under their
completion threads, a context destroyed while another thread launches into a second context
(completion threads of both contexts and the destroy's wait for its drain racing), a capture
begun beside them, high and low priority. A data race reported is a failure."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from qshare.native_build import ASAN_TOOLS, build_cuda

from .conftest import HP_VGPU, LP_VGPU, NodeOwner, Probe, parse_reply

TSAN_PROBE = ASAN_TOOLS.parent / "cuda-tests-tsan" / "probe-direct"
TSAN_EXIT = 66

STREAMS = [
    "init",
    "spread 100 200 18",
    "alternate 100 200 0 17",
    "threads 4 kernel",
    "phases 10 200 2000 5 3",
]
DESTROYS = ["destroystream extra", "spread 100 100 4", "ctx2 100 20", "destroystream probe"]
CONTEXT_RACE = ["ctxrace 200 30", "otherctx 100 20", "ctxrace 100 40"]
CAPTURE = ["launch kernel 1000 5", "capture begin", "sleep 5", "capture end"]


@pytest.fixture(scope="module")
def tsan_probe(cuda_build: Path) -> Path:
    build_cuda("tsan")
    return TSAN_PROBE


@pytest.mark.parametrize("vgpu", [HP_VGPU, LP_VGPU], ids=["high", "low"])
def test_streams_destroys_and_captures_run_race_free(
    tsan_probe: Path, node: NodeOwner, vgpu: int, hp_probe: Probe
) -> None:
    env = node.env(vgpu) | {"TSAN_OPTIONS": f"halt_on_error=1:exitcode={TSAN_EXIT}"}
    assert node.command("window 0 2000")["rc"] == "0"
    commands = [*STREAMS, *DESTROYS, *CONTEXT_RACE, *CAPTURE, "launch kernel 100 20", "sleep 20"]
    done = subprocess.run(
        [str(tsan_probe), *commands], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-4000:]
    replies = [parse_reply(line) for line in done.stdout.splitlines()]
    assert all(r["rc"] == "0" for r in replies if "rc" in r), replies


POOLS_AND_GRAPHS = [
    "init",
    "alloc async 4194304",
    "asyncpair 8388608",
    "freerace 0 4194304",
    "free 1",
    "graph alloc 4194304",
    "graph launch",
    "graph racedestroy 8388608",
    "graph launch",
    "graph destroy",
    "pool trim 0",
]


@pytest.mark.parametrize("delays", ["prompt", "delayed"])
def test_pool_and_graph_memory_accounting_across_threads_is_race_free(
    tsan_probe: Path, node: NodeOwner, delays: str
) -> None:
    """Two threads allocating from one pool, a free racing an allocation given its address, and
    an executable graph destroyed while another thread instantiates one (the fake driver, a
    test double, holding its answers in the delayed run)."""
    env = node.env(HP_VGPU) | {"TSAN_OPTIONS": f"halt_on_error=1:exitcode={TSAN_EXIT}"}
    if delays == "delayed":
        env |= {
            "QSHARE_FAKE_POOL_ALLOC_DELAY_MS": "20",
            "QSHARE_FAKE_FREE_DELAY_MS": "100",
            "QSHARE_FAKE_EXEC_DESTROY_DELAY_MS": "100",
        }
    done = subprocess.run(
        [str(tsan_probe), *POOLS_AND_GRAPHS], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-4000:]
    replies = [parse_reply(line) for line in done.stdout.splitlines()]
    assert all(r["rc"] == "0" for r in replies if "rc" in r), replies
    assert all(r.get("rc2", "0") == "0" for r in replies), replies
