"""The interposer under AddressSanitizer and UBSan: the direct-call probe linked to a
sanitized build of it (not preloaded: ASan must come first), run through every path."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from qshare.native_build import ASAN_TOOLS, ROOT, build_cuda

from .conftest import CARD_UUID, LP_VGPU, SMALL_LIMIT, SMALL_VGPU, NodeOwner, parse_reply

ASAN_DIR = ASAN_TOOLS
SUPPRESSIONS = ROOT / "native" / "cuda" / "testing" / "lsan.supp"
QS_EV_DETACH = 7
QS_EV_CLIENT_DIED = 8
KINDS = ["plain", "pitch", "managed", "async", "pool", "vmm", "array", "array3d"]


@pytest.fixture(scope="module")
def sanitized_probe(cuda_build: Path) -> Path:
    build_cuda("asan")
    return ASAN_DIR / "probe-direct"


def run_sanitized(
    probe: Path,
    node: NodeOwner,
    vgpu: int,
    commands: list[str],
    extra: dict[str, str] | None = None,
) -> list[str]:
    env = (
        node.env(vgpu)
        | (extra or {})
        | {
            "ASAN_OPTIONS": "abort_on_error=0:exitcode=86",
            "LSAN_OPTIONS": f"suppressions={SUPPRESSIONS}",
            "UBSAN_OPTIONS": "halt_on_error=1:exitcode=87",
        }
    )
    done = subprocess.run(
        [str(probe), *commands], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_allocation_paths_run_clean(sanitized_probe: Path, node: NodeOwner) -> None:
    commands = ["init"]
    for i, kind in enumerate(KINDS):
        commands += [f"alloc {kind} 4096", f"free {i}"]
    commands += [f"alloc plain {SMALL_LIMIT + 1}", "meminfo", "nvml"]
    replies = [
        parse_reply(line) for line in run_sanitized(sanitized_probe, node, SMALL_VGPU, commands)
    ]
    assert [r["rc"] for r in replies if r["cmd"] == "alloc"] == ["0"] * len(KINDS) + ["2"]


MIB = 1 << 20
REFUSALS = {
    "other pool": (
        {"QSHARE_FAKE_ASYNC_OTHER_POOL": "1"},
        [
            f"alloc pool {512 * MIB}",
            "free 0",
            f"alloc plain {256 * MIB}",
            f"alloc async {512 * MIB}",
        ],
    ),
    "free refused": (
        {"QSHARE_FAKE_POOL_NO_REUSE": "1", "QSHARE_FAKE_FREE_ASYNC_FAILS_FROM": "2"},
        [f"alloc async {768 * MIB}", "free 0", f"alloc async {768 * MIB}", "sync"],
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_allocations_refused_after_the_driver_made_them_run_clean(
    sanitized_probe: Path, node: NodeOwner, case: str
) -> None:
    """The fake driver (a test double) makes a stream-ordered allocation come from another pool
    than the interposer guessed, or refuses the free of one the interposer refuses."""
    extra, commands = REFUSALS[case]
    replies = [
        parse_reply(line)
        for line in run_sanitized(sanitized_probe, node, SMALL_VGPU, ["init", *commands], extra)
    ]
    assert [r["rc"] for r in replies if r["cmd"] == "alloc"][-1] == "2", replies


def test_launch_paths_run_clean(sanitized_probe: Path, node: NodeOwner) -> None:
    commands = ["init"] + [f"launch {k} 100 20" for k in ("kernel", "ex", "coop", "graph", "host")]
    replies = [
        parse_reply(line)
        for line in run_sanitized(sanitized_probe, node, LP_VGPU, [*commands, "sync"])
    ]
    assert all(r["rc"] == "0" for r in replies)


def test_device_gate_and_statistics_run_clean(
    sanitized_probe: Path, node: NodeOwner, tmp_path: Path
) -> None:
    stats = tmp_path / "stats.json"
    extra = {"QSHARE_LP_DEVICE_GATE": "1", "QSHARE_STATS_FILE": str(stats)}
    commands = ["init", "launch kernel 200 50", "launch legacy 0 20", "launch default 0 20"]
    replies = [
        parse_reply(line)
        for line in run_sanitized(sanitized_probe, node, LP_VGPU, [*commands, "sync"], extra)
    ]
    assert all(r["rc"] == "0" for r in replies)
    assert '"lp_device_gate_waits"' in stats.read_text()


def test_exit_while_another_thread_launches_runs_clean(
    sanitized_probe: Path, node: NodeOwner
) -> None:
    commands = ["init", "spin 0", "launch kernel 10 50", "alloc plain 4096"]
    run_sanitized(sanitized_probe, node, LP_VGPU, commands)
    assert len(node.wait_events(QS_EV_DETACH, 1)) == 1
    assert node.events(QS_EV_CLIENT_DIED) == []


def test_exit_while_another_thread_is_held_in_a_launch_runs_clean(
    sanitized_probe: Path, node: NodeOwner
) -> None:
    run_sanitized(sanitized_probe, node, LP_VGPU, ["init", "hold"])
    assert len(node.wait_events(QS_EV_CLIENT_DIED, 1)) == 1


def test_threads_that_launch_and_exit_run_clean(sanitized_probe: Path, node: NodeOwner) -> None:
    """Low priority tracks the default stream; the threads' launches into the probe's stream
    are one unit each, with events that go with each thread when it exits."""
    commands = ["init", "launch default 0 1", "threads 10 kernel", "events", "sync"]
    replies = [
        parse_reply(line) for line in run_sanitized(sanitized_probe, node, LP_VGPU, commands)
    ]
    assert all(r["rc"] == "0" for r in replies if "rc" in r)


def test_capture_stream_destroy_and_context_reset_run_clean(
    sanitized_probe: Path, node: NodeOwner
) -> None:
    commands = ["init", "launch kernel 1000 20", "capture begin", "sleep 20", "capture end"]
    commands += ["launch default 100 20", "launch kernel 100 20", "destroystream", "sleep 5"]
    commands += ["reset", "launch default 100 20", "launch kernel 100 20", "reset release"]
    commands += ["launch default 100 5", "deadhandles"]
    replies = [
        parse_reply(line) for line in run_sanitized(sanitized_probe, node, LP_VGPU, commands)
    ]
    assert all(r["rc"] == "0" for r in replies if "rc" in r), replies


def test_many_streams_destroys_and_contexts_run_clean(
    sanitized_probe: Path, node: NodeOwner
) -> None:
    """Low priority over 18 streams (16 batched, 2 one unit per launch), from threads that exit,
    streams and a second context destroyed, the primary context reset."""
    commands = ["init", "spread 100 200 18", "alternate 100 100 0 17", "threads 4 kernel"]
    commands += ["destroystream extra", "spread 100 100 4", "ctx2 100 20", "sync"]
    commands += ["reset", "spread 100 100 4", "sync", "sleep 5", "deadhandles"]
    replies = [
        parse_reply(line) for line in run_sanitized(sanitized_probe, node, LP_VGPU, commands)
    ]
    assert all(r["rc"] == "0" for r in replies if "rc" in r), replies
    assert replies[-1] == {"cmd": "deadhandles", "n": "0"}


def test_composing_cuda_visible_devices_runs_clean(sanitized_probe: Path, node: NodeOwner) -> None:
    """The interposer's constructor composing CUDA_VISIBLE_DEVICES from QSHARE_VISIBLE_<INDEX>
    (a card named twice, out of order), and refusing a malformed one."""
    second = "GPU-0a1b2c3d-0000-4000-8000-00000000c1de"
    cards = {"QSHARE_FAKE_GPU_COUNT": "2", "QSHARE_FAKE_GPU_UUID_1": second}
    named = {
        "QSHARE_VISIBLE_1": second,
        "QSHARE_VISIBLE_0": CARD_UUID,
        "QSHARE_VISIBLE_00": CARD_UUID,
    }
    [line] = run_sanitized(sanitized_probe, node, LP_VGPU, ["cards"], cards | named)
    assert parse_reply(line)["visible"] == f"{CARD_UUID},{second}"
    bad = named | {"QSHARE_VISIBLE_9": "GPU-nope"}
    [line] = run_sanitized(sanitized_probe, node, LP_VGPU, ["cards"], cards | bad)
    assert parse_reply(line)["visible"] == "-"
