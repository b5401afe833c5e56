"""Trace replay through the fake driver: recorded timelines become launches of the recorded
device time, the fake driver runs them asynchronously and in order on its device thread,
and the replay program's pass ends only when the device has finished them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from qshare.bench import traces
from qshare.native_build import TOOLS

from .conftest import LP_VGPU, NodeOwner, parse_reply

MS = 1_000_000


@pytest.mark.parametrize("name", [traces.LP_TRAINING, traces.LP_GPT2, traces.HP_EAGER])
def test_timeline_keeps_the_launch_calls_and_the_device_time(name: str) -> None:
    data = traces._workloads()[name]
    rows = traces.timeline(name, 1.0)
    assert len(rows) == len(data["host_launches"])
    device_ns = sum(round(d[2] * 1000) for d in data["device"])
    assert abs(sum(d for _, d in rows) - device_ns) <= len(rows)


def test_unknown_workload_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match=traces.LP_TRAINING):
        traces.timeline("lp_nonexistent")


def test_a_window_costs_an_ideal_launcher_only_where_the_host_runs_ahead() -> None:
    assert traces.window_model_ratio(traces.LP_TRAINING, 20 * MS) == pytest.approx(1.0)
    assert traces.window_model_ratio(traces.LP_TRAINING, MS // 10) < 0.9


def test_fake_driver_runs_kernels_asynchronously_and_in_order(node: NodeOwner) -> None:
    done = subprocess.run(
        [str(TOOLS / "probe-direct"), "init", "launch kernel 5000 20", "sync"],
        env=node.env(None),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    replies = {r["cmd"]: r for r in map(parse_reply, done.stdout.splitlines())}
    assert replies["launch"]["rc"] == "0"
    launched, synced = int(replies["launch"]["t"]), int(replies["sync"]["t"])
    start = int(replies["launch"]["start"])
    assert launched - start < 50 * MS  # submitting did not wait for the 100 ms of kernels
    assert synced - start >= 100 * MS  # they ran one after the other


def test_replay_program_waits_for_the_recorded_device_time(node: NodeOwner, tmp_path: Path) -> None:
    timeline = tmp_path / "timeline.txt"
    timeline.write_text("".join(f"{10_000} {2 * MS}\n" for _ in range(25)))
    env = node.env(None)
    done = subprocess.run(
        [str(TOOLS / "trace-replay"), str(timeline), "2", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    fields = dict(pair.split("=", 1) for pair in done.stdout.split()[1:])
    assert done.returncode == 0 and fields["rc"] == "0", done.stderr
    assert int(fields["launches"]) == 25
    assert int(fields["wall_ns"]) >= 2 * 25 * 2 * MS


def test_replay_under_the_interposer_counts_every_launch(node: NodeOwner, tmp_path: Path) -> None:
    timeline = tmp_path / "timeline.txt"
    traces.write_timeline(timeline, traces.LP_TRAINING)
    env = node.env(LP_VGPU)
    env["LD_PRELOAD"] = str(TOOLS.parent / "libqshare-cuda.so")
    done = subprocess.run(
        [str(TOOLS / "trace-replay"), str(timeline), "1", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert node.stats(LP_VGPU)["launches"] == 2457
