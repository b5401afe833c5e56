"""Low priority's in-flight window in device time, through the interposer and the fake
driver: settable per card at run time, deep windows keep many launches in flight (the
process never fails for it), completion is tracked by batch and device time accounted."""

from __future__ import annotations

import pytest

from .conftest import LP_VGPU, NodeOwner, Probe, run_probe

MS = 1_000_000


def test_window_is_set_at_run_time_and_reported_in_card_stats(node: NodeOwner) -> None:
    reply = node.command("window 0 2500")
    assert reply["rc"] == "0"
    assert int(reply["lp_window_ns"]) == 2_500_000


@pytest.mark.parametrize("us", [0, 2_000_000])
def test_window_outside_its_range_is_refused(node: NodeOwner, us: int) -> None:
    assert node.command(f"window 0 {us}")["rc"] != "0"


def test_window_on_an_unknown_card_is_refused(node: NodeOwner) -> None:
    assert node.command("window 5 1000")["rc"] != "0"


@pytest.mark.parametrize("style", ["direct", "runtime-per-thread"])
def test_deep_window_keeps_over_64_launches_in_flight_without_failing(
    node: NodeOwner, style: str
) -> None:
    """300 kernels of 1 ms under a 1 s window: the launch loop returns while more than 100
    of them are still queued on the device (batched on a named stream; one unit per launch
    on the per-thread default stream), every call succeeds and every launch is counted."""
    assert node.command("window 0 1000000")["rc"] == "0"
    run = run_probe(node, LP_VGPU, ["init", "launch kernel 1000 300", "sync"], style=style)
    assert run.returncode == 0, run.stderr
    assert run.rc("launch") == 0 and run.rc("sync") == 0
    assert int(run.reply("sync")["t"]) - int(run.reply("launch")["t"]) >= 100 * MS
    assert node.stats(LP_VGPU)["launches"] == 300


def test_deep_window_past_the_unit_ring_counts_and_times_every_launch(node: NodeOwner) -> None:
    """The per-thread default stream goes one unit per launch (the batched tracking takes
    only streams it can fence): 3,000 kernels of 100 us under a 1 s window are more units
    than the tracker's ring of 1,024 slots holds, and every call succeeds, every launch is
    counted, and each unit's device time is measured by its own events: 300 ms in all."""
    assert node.command("window 0 1000000")["rc"] == "0"
    probe = Probe(node, LP_VGPU, style="runtime-per-thread")
    replies = [probe.ask(c) for c in ("init", "launch default 100 3000", "sync")]
    assert [int(r["rc"]) for r in replies] == [0, 0, 0]
    device_ns = node.device_ns_once(LP_VGPU, 300 * MS)
    assert 300 * MS <= device_ns <= 600 * MS
    assert node.stats(LP_VGPU)["launches"] == 3000
    probe.close()


def test_narrow_window_keeps_submission_close_to_the_device(
    node: NodeOwner, hp_probe: Probe
) -> None:
    """With a 2 ms window and a high-priority process attached, 40 kernels of 5 ms cannot
    be submitted much ahead of the device: once the kernel time is measured, a launch
    waits until the one before has completed."""
    assert node.command("window 0 2000")["rc"] == "0"
    run = run_probe(node, LP_VGPU, ["init", "launch kernel 5000 40", "sync"])
    assert run.rc("launch") == 0
    assert int(run.reply("launch")["t"]) - int(run.reply("launch")["start"]) >= 150 * MS


def test_window_widens_while_no_high_priority_process_is_attached(node: NodeOwner) -> None:
    """Nobody to protect: the 2 ms window acts as 20 ms, so the launch loop of 40 kernels of
    5 ms returns while more than 12 ms of them are still queued."""
    assert node.command("window 0 2000")["rc"] == "0"
    run = run_probe(node, LP_VGPU, ["init", "launch kernel 5000 40", "sync"])
    assert run.rc("sync") == 0
    assert int(run.reply("sync")["t"]) - int(run.reply("launch")["t"]) >= 12 * MS


def test_batched_device_time_is_accounted_from_batch_events(node: NodeOwner) -> None:
    probe = Probe(node, LP_VGPU)
    assert [int(probe.ask(c)["rc"]) for c in ("init", "launch kernel 2000 100", "sync")] == [0] * 3
    device_ns = node.device_ns_once(LP_VGPU, 180 * MS)
    assert 180 * MS <= device_ns <= 400 * MS  # 100 kernels of 2 ms, measured by batch
    probe.close()


def test_an_untimed_batch_is_charged_at_its_own_streams_estimate(node: NodeOwner) -> None:
    """The probe's stream measures 100 us per launch. The default stream then runs 5,000
    kernels of 1 us (the process's estimate falls to about 1 us per launch) and one of 40 ms;
    while that one is in flight, the probe's stream, idle, takes 500 more launches of 100 us.
    Their first batch cannot be timed (the card is busy with the other stream), so it is
    charged at the probe stream's own estimate, not at the process's. Exact total: 145 ms."""
    assert node.command("window 0 1000000")["rc"] == "0"
    probe = Probe(node, LP_VGPU)
    assert [int(probe.ask(c)["rc"]) for c in ("init", "launch kernel 100 500", "sync")] == [0] * 3
    assert node.device_ns_once(LP_VGPU, 50 * MS) >= 50 * MS
    steps = ("launch default 1 5000", "launch default 40000 1", "launch kernel 100 500", "sync")
    assert [int(probe.ask(c)["rc"]) for c in steps] == [0] * 4
    device_ns = node.device_ns_once(LP_VGPU, 145 * MS)
    assert 135 * MS <= device_ns <= 165 * MS
    probe.close()


def test_a_stream_of_long_kernels_is_held_to_the_window_beside_a_stream_of_short_ones(
    node: NodeOwner, hp_probe: Probe
) -> None:
    """A process whose one stream runs bursts of 500 kernels of 10 us and whose other runs 20
    of 5 ms between them, with a 2 ms window and high priority attached. The short stream's
    batches teach a per-launch estimate of about 10 us; the long stream must still be held to
    about one kernel in flight (what high priority would wait behind), not 20 at 10 us each.
    After a first round, where the long stream is not yet measured, the most kernel time
    queued at once stays under the window plus two long kernels."""
    assert node.command("window 0 2000")["rc"] == "0"
    probe = Probe(node, LP_VGPU)
    first_round = ("init", "phases 10 500 5000 20 1", "sync")
    assert [int(probe.ask(c)["rc"]) for c in first_round] == [0, 0, 0]
    probe.ask("queued")
    assert int(probe.ask("phases 10 500 5000 20 3")["rc"]) == 0
    assert int(probe.ask("sync")["rc"]) == 0
    assert int(probe.ask("queued")["max_ns"]) <= 12 * MS
    probe.close()
