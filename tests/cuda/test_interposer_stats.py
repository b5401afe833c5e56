"""The interposer's statistics (QSHARE_STATS_FILE), through the fake driver: each launch is
counted by the path it took, low priority's fences and window waits and high priority's
fences are counted, and the whole is written as JSON when the process exits."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .conftest import HP_VGPU, LP_VGPU, NodeOwner, Probe, run_probe

MS = 1_000_000


def run_with_stats(
    node: NodeOwner, vgpu: int, commands: list[str], tmp_path: Path
) -> dict[str, Any]:
    path = tmp_path / f"stats-{vgpu}.json"
    run = run_probe(node, vgpu, ["init", *commands], extra_env={"QSHARE_STATS_FILE": str(path)})
    assert run.returncode == 0, run.stderr
    stats: dict[str, Any] = json.loads(path.read_text())
    return stats


def test_low_priority_launches_into_one_stream_are_counted_as_batched(
    node: NodeOwner, tmp_path: Path
) -> None:
    stats = run_with_stats(node, LP_VGPU, ["launch kernel 0 200", "sync"], tmp_path)
    assert stats["priority"] == "low"
    assert stats["launches"]["batched"] == stats["launches"]["total"] == 200
    assert stats["failed"] == 0
    assert stats["lp_batches_done"] >= 1


def test_every_batch_of_low_priority_launches_is_fenced(node: NodeOwner, tmp_path: Path) -> None:
    """Launches of 1 ms each: batches close (a fence by a launch or by the completion
    thread at the burst's end) and the completion thread ends each of them."""
    stats = run_with_stats(node, LP_VGPU, ["launch kernel 1000 40", "sync"], tmp_path)
    fences = stats["lp_fences_by_launch"] + stats["lp_fences_by_tail"]
    assert fences >= 1
    assert stats["lp_batches_done"] >= fences


def test_both_names_of_the_legacy_default_stream_are_batched_as_one_stream(
    node: NodeOwner, tmp_path: Path
) -> None:
    """NULL and CU_STREAM_LEGACY are the same stream: neither falls back to an event per
    launch."""
    commands = ["launch default 0 50", "launch legacy 0 50", "sync"]
    stats = run_with_stats(node, LP_VGPU, commands, tmp_path)
    assert stats["launches"]["batched"] == 100
    assert stats["launches"]["event"] == 0


def test_high_priority_launches_open_a_unit_and_join_it(node: NodeOwner, tmp_path: Path) -> None:
    stats = run_with_stats(node, HP_VGPU, ["launch kernel 200 50", "sync"], tmp_path)
    launches = stats["launches"]
    assert stats["priority"] == "high"
    assert launches["opening"] >= 1 and launches["joined"] >= 1
    assert launches["opening"] + launches["joined"] == 50
    assert stats["hp_fences"] >= launches["opening"]


def test_each_launch_is_timed_in_the_interposer_and_in_the_driver(
    node: NodeOwner, tmp_path: Path
) -> None:
    stats = run_with_stats(node, LP_VGPU, ["launch kernel 0 100", "sync"], tmp_path)
    timed = stats["ns_per_launch"]
    for part in ("interposer", "driver"):
        assert timed[part]["sum"] > 0
        assert 0 < timed[part]["p50"] <= timed[part]["p99"]


def test_launches_held_by_the_window_are_counted_with_their_wait(
    node: NodeOwner, hp_probe: Probe, tmp_path: Path
) -> None:
    """A 2 ms window beside an attached high-priority process: 20 kernels of 5 ms cannot all
    be queued, so launches wait for completions, for at least the work beyond the window."""
    assert node.command("window 0 2000")["rc"] == "0"
    stats = run_with_stats(node, LP_VGPU, ["launch kernel 5000 20", "sync"], tmp_path)
    assert stats["lp_window_waits"] >= 1
    assert stats["lp_window_wait_ns"] >= 10 * 5 * MS
    assert stats["lp_window_ns"] == 2 * MS


def test_a_stats_file_that_cannot_be_written_is_named_and_launches_still_run(
    node: NodeOwner, tmp_path: Path
) -> None:
    path = tmp_path / "missing" / "stats.json"
    env = {"QSHARE_STATS_FILE": str(path)}
    run = run_probe(node, LP_VGPU, ["init", "launch kernel 0 10", "sync"], extra_env=env)
    assert run.returncode == 0 and run.rc("launch") == 0
    assert f"QSHARE_STATS_FILE='{path}' cannot be written" in run.stderr
    assert not path.exists()


def test_a_forked_child_that_exits_normally_leaves_the_parents_statistics_whole(
    node: NodeOwner, tmp_path: Path
) -> None:
    """The child's counters are a copy of the parent's: it writes nothing, so the file holds
    the attached process's one JSON object, not the child's copy beside it."""
    stats = run_with_stats(node, LP_VGPU, ["launch kernel 0 10", "fork", "sync"], tmp_path)
    assert stats["launches"]["total"] == 10


def test_the_stats_file_is_not_left_open_in_programs_the_process_executes(
    node: NodeOwner, tmp_path: Path
) -> None:
    """Its descriptor is close-on-exec: a program the workload starts does not inherit it."""
    path = tmp_path / "stats.json"
    probe = Probe(node, LP_VGPU, extra_env={"QSHARE_STATS_FILE": str(path)})
    assert probe.ask("init")["rc"] == "0"
    fds = Path(f"/proc/{probe.process.pid}/fd")
    (fd,) = [fd.name for fd in fds.iterdir() if os.readlink(fd) == str(path)]
    flags = (fds.parent / "fdinfo" / fd).read_text().split("flags:")[1].split()[0]
    probe.close()
    assert int(flags, 8) & os.O_CLOEXEC
