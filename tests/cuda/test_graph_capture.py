"""A CUDA program captures a graph in the driver's default (global) mode while other threads
of it keep launching: the interposer's own threads, which wait on events meanwhile, must not
break the capture (the driver forbids a thread in global mode such waits during another
thread's global capture, and invalidates that capture)."""

from __future__ import annotations

import pytest

from .conftest import HP_VGPU, LP_VGPU, NodeOwner, run_probe

CAPTURE_INVALIDATED = 901

# The probe's main thread captures into a stream of its own for 50 ms while a second thread
# launches 1 ms kernels without pause.
CAPTURE_BESIDE_LAUNCHES = ["init", "spin 1000 {kind}", "capture begin", "sleep 50", "capture end"]


@pytest.mark.parametrize("vgpu", [HP_VGPU, LP_VGPU], ids=["high", "low"])
def test_completion_waits_leave_a_global_capture_on_another_thread_intact(
    node: NodeOwner, vgpu: int
) -> None:
    """Launches into the probe's stream: high priority's coalesced unit, low priority's
    batches; their completion threads wait on fences throughout the capture."""
    commands = [c.format(kind="kernel") for c in CAPTURE_BESIDE_LAUNCHES]
    run = run_probe(node, vgpu, commands)
    assert run.rc("spin") == 0 and run.rc("capture", 0) == 0
    assert run.rc("capture", 1) == 0, run.stderr


@pytest.mark.parametrize("vgpu", [HP_VGPU, LP_VGPU], ids=["high", "low"])
def test_per_launch_units_leave_a_global_capture_on_another_thread_intact(
    node: NodeOwner, vgpu: int
) -> None:
    """Launches into the per-thread default stream: one unit per launch, whose events the
    launching thread itself queries and waits on."""
    commands = [c.format(kind="default") for c in CAPTURE_BESIDE_LAUNCHES]
    run = run_probe(node, vgpu, commands, style="runtime-per-thread")
    assert run.rc("spin") == 0 and run.rc("capture", 0) == 0
    assert run.rc("capture", 1) == 0, run.stderr


@pytest.mark.parametrize("vgpu", [HP_VGPU, LP_VGPU], ids=["high", "low"])
def test_fences_behind_legacy_stream_work_leave_a_blocking_streams_capture_intact(
    node: NodeOwner, vgpu: int
) -> None:
    """The program's launches into the legacy default stream are all made before its capture
    into a blocking stream begins (using the legacy stream during it would be invalid, since
    the legacy stream waits for every blocking one); the fences the interposer's completion
    threads record behind that work must not use the legacy stream during the capture."""
    commands = ["init", "launch default 2000 10", "capture begin", "sleep 50", "capture end"]
    run = run_probe(node, vgpu, commands)
    assert run.rc("launch") == 0 and run.rc("capture", 0) == 0
    assert run.rc("capture", 1) == 0, run.stderr


def test_a_capture_of_one_tracked_stream_beside_launches_into_another_stays_intact(
    node: NodeOwner,
) -> None:
    """Low priority tracks both of its streams by batch: the probe's stream, launched into
    first, is then captured while a second thread launches into a second stream without
    pause; neither stream's completion thread may record into the captured one."""
    commands = ["init", "launch kernel 2000 10", "spin 1000 second", "capture begin probe"]
    run = run_probe(node, LP_VGPU, [*commands, "sleep 50", "capture end"])
    assert run.rc("launch") == 0 and run.rc("spin") == 0 and run.rc("capture", 0) == 0
    assert run.rc("capture", 1) == 0, run.stderr
