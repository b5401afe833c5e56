"""Launches into a stream of a context that is not current, through the interposer and the
fake driver (which, as the real driver, refuses to record an event into a stream of another
context): low priority's batch fences are made in the stream's own context."""

from __future__ import annotations

from .conftest import HP_VGPU, LP_VGPU, NodeOwner, Probe, run_probe

MS = 1_000_000


def test_low_priority_fences_a_stream_of_a_non_current_context_in_that_context(
    node: NodeOwner,
) -> None:
    """Context A current, 50 kernels of 1 ms launched into a stream created in context B:
    every fence is recorded (none refused for another context's event), so every launch is
    counted and its device time measured. Before, the stream's slot was bound to A and its
    fences made in A: each recording was refused, and the launches ended as they were."""
    probe = Probe(node, LP_VGPU)
    assert probe.ask("init")["rc"] == "0"
    reply = probe.ask("otherctx 1000 50")
    assert reply["rc"] == "0" and int(reply["cross"]) == 0
    assert 40 * MS <= node.device_ns_once(LP_VGPU, 40 * MS) <= 150 * MS
    assert node.stats(LP_VGPU)["launches"] == 50
    probe.close()


def test_high_priority_fences_a_stream_of_a_non_current_context_in_that_context(
    node: NodeOwner,
) -> None:
    """The same for high priority's coalesced unit: its fence is made in the stream's context,
    so one unit opens and covers the 50 launches (the vGPU counts one). Before, the fence was
    made in the current context and every recording refused: no unit opened, and each of the
    50 launches was ended at once, before its work (high priority turned quiet while it ran)."""
    run = run_probe(node, HP_VGPU, ["init", "otherctx 1000 50"])
    assert run.returncode == 0, run.stderr
    assert run.rc("otherctx") == 0
    assert int(run.reply("otherctx")["cross"]) == 0
    assert node.stats(HP_VGPU)["launches"] == 1


def test_high_priority_units_of_a_second_stream_are_fenced_in_that_streams_context(
    node: NodeOwner,
) -> None:
    """A unit is open on the probe's stream (a 50 ms kernel) when 20 launches go into a stream
    of a second, non-current context: they take the per-launch path, whose events are made in
    that stream's context, so every recording is accepted and each unit ends when its work
    does. Before, they were made in the current context and every recording refused: each
    launch was ended at once, before its work."""
    run = run_probe(node, HP_VGPU, ["init", "launch kernel 50000 1", "otherctx 1000 20"])
    assert run.returncode == 0, run.stderr
    assert run.rc("otherctx") == 0
    assert int(run.reply("otherctx")["cross"]) == 0


def test_low_priority_launches_past_the_batched_streams_are_timed_in_their_streams_context(
    node: NodeOwner,
) -> None:
    """16 streams of the current context take every batched slot; 20 kernels of 1 ms then go
    into a stream of a second, non-current context, one unit each: their timing events are made
    in that stream's context, recorded, and their device time measured. Before, they were made
    in the current context, every recording was refused, and the launches ended untimed."""
    probe = Probe(node, LP_VGPU)
    assert probe.ask("init")["rc"] == "0"
    assert probe.ask("spread 100 16 16")["rc"] == "0"
    reply = probe.ask("otherctx 1000 20")
    assert reply["rc"] == "0" and int(reply["cross"]) == 0
    assert node.device_ns_once(LP_VGPU, 15 * MS) >= 15 * MS
    assert node.stats(LP_VGPU)["launches"] == 36
    probe.close()
