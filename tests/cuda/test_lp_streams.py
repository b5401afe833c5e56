"""Low priority's launches into several streams, through the interposer and the fake driver:
every stream is tracked by batch (a fence per batch, not two events per launch), the one
window bounds the work in flight summed over the streams, and no launch waits for good, also
past the number of streams tracked at once."""

from __future__ import annotations

from .conftest import LP_VGPU, NodeOwner, Probe, run_probe

MS = 1_000_000


def test_launches_into_two_streams_cost_batch_fences_not_two_events_each(
    node: NodeOwner,
) -> None:
    """1,000 kernels of 10 us alternating between two streams: the per-launch path recorded two
    events for each launch into the second stream (1,000 records); batches record far fewer."""
    run = run_probe(node, LP_VGPU, ["init", "spread 10 1000 2", "sync", "records"])
    assert run.rc("spread") == 0 and run.rc("sync") == 0
    assert int(run.reply("records")["n"]) < 200
    assert node.stats(LP_VGPU)["launches"] == 1000


def test_the_window_bounds_the_work_in_flight_summed_over_streams(
    node: NodeOwner, hp_probe: Probe
) -> None:
    """A 2 ms window (a high-priority process is attached): 40 kernels of 5 ms spread over
    two streams cannot be submitted far ahead of the device: the loop is held, and what is left
    when it returns is about one kernel per stream. (That the sum over streams is what counts,
    stream by stream under the window but not together, is tested on lp_batch.c alone:
    test_units.py.)"""
    assert node.command("window 0 2000")["rc"] == "0"
    run = run_probe(node, LP_VGPU, ["init", "spread 5000 40 2", "sync"])
    assert run.rc("spread") == 0 and run.rc("sync") == 0
    submitting = int(run.reply("spread")["t"]) - int(run.reply("spread")["start"])
    draining = int(run.reply("sync")["t"]) - int(run.reply("spread")["t"])
    assert submitting >= 60 * MS
    assert draining <= 20 * MS


def test_launches_into_more_streams_than_are_tracked_all_complete(node: NodeOwner) -> None:
    """20 streams (16 tracked by batch, the rest one unit per launch) under a narrow window:
    every launch returns, is counted and ends."""
    assert node.command("window 0 2000")["rc"] == "0"
    run = run_probe(node, LP_VGPU, ["init", "spread 100 600 20", "sync", "sleep 20"])
    assert run.returncode == 0, run.stderr
    assert run.rc("spread") == 0 and run.rc("sync") == 0
    stats = node.stats(LP_VGPU)
    assert stats["launches"] == 600
    assert "more than 16" in run.stderr


def test_slots_of_destroyed_streams_are_reused_by_new_streams(node: NodeOwner) -> None:
    """16 streams tracked, 15 of them destroyed, then 15 new ones: the destroyed streams' slots
    are freed once their launches ended, so the new streams are tracked by batch too (no
    warning, and a fence per batch rather than two events per launch)."""
    first = ["init", "spread 10 320 16", "sync", "destroystream extra", "sleep 50", "records"]
    run = run_probe(node, LP_VGPU, [*first, "spread 10 320 16", "sync", "records"])
    assert all(r["rc"] == "0" for r in run.replies if "rc" in r), run.replies
    assert "more than 16" not in run.stderr
    added = int(run.reply("records", 1)["n"]) - int(run.reply("records", 0)["n"])
    assert added < 400  # one unit per launch: two records each, 600 for the new streams alone
    assert node.stats(LP_VGPU)["launches"] == 640


def test_the_window_bounds_batched_and_per_launch_work_together(
    node: NodeOwner, hp_probe: Probe
) -> None:
    """16 streams tracked by batch, then 100 us kernels alternating between a tracked stream
    and a 17th (one unit per launch) under a 2 ms window: the kernels still queued on the
    device when the loop returns are the window's worth, about 20, not a window's worth on
    each path (about 40)."""
    assert node.command("window 0 2000")["rc"] == "0"
    commands = ["init", "spread 100 160 16", "sync", "alternate 100 600 0 16", "kernels"]
    run = run_probe(node, LP_VGPU, [*commands, "sync"])
    assert all(r["rc"] == "0" for r in run.replies if "rc" in r), run.replies
    queued = 160 + 600 - int(run.reply("kernels")["n"])
    assert queued <= 28
