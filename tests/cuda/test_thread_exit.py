"""Threads that launch and exit (a pool that replaces its threads, a thread per request):
what the interposer made for a thread's launches goes with the thread."""

from __future__ import annotations

import pytest

from .conftest import HP_VGPU, LP_VGPU, NodeOwner, run_probe

THREADS = 40


@pytest.mark.parametrize("vgpu", [HP_VGPU, LP_VGPU], ids=["high", "low"])
def test_threads_that_exit_leave_no_events_of_their_units_behind(
    node: NodeOwner, vgpu: int
) -> None:
    """Each thread launches once into its per-thread default stream (one unit per launch,
    timed by events of the thread's own)."""
    commands = ["init", "threads 1 default", "events", f"threads {THREADS} default", "events"]
    run = run_probe(node, vgpu, commands, style="runtime-per-thread")
    assert run.rc("threads", 0) == 0 and run.rc("threads", 1) == 0, run.stderr
    before, after = int(run.reply("events", 0)["n"]), int(run.reply("events", 1)["n"])
    assert after - before < THREADS // 4
