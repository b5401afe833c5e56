"""The program destroys the stream its launches went into right after launching (its queued
work still runs, as on the real driver): the interposer's completion threads, which fence that
work after a pause, must not hand the driver the destroyed stream."""

from __future__ import annotations

import pytest

from .conftest import HP_VGPU, LP_VGPU, NodeOwner, run_probe


@pytest.mark.parametrize("vgpu", [HP_VGPU, LP_VGPU], ids=["high", "low"])
def test_the_interposer_uses_no_stream_the_program_destroyed(node: NodeOwner, vgpu: int) -> None:
    """Five kernels of 200 us into the probe's stream (the tracked one: the first launched
    into), destroyed at once; the probe then launches into a new stream."""
    commands = ["init", "launch kernel 200 5", "destroystream", "sleep 5", "launch kernel 200 5"]
    run = run_probe(node, vgpu, [*commands, "sync", "deadhandles"])
    assert all(r["rc"] == "0" for r in run.replies if "rc" in r), run.replies
    assert run.reply("deadhandles")["n"] == "0"


def test_low_priority_uses_no_second_stream_the_program_destroyed(node: NodeOwner) -> None:
    """Kernels spread over the probe's stream and a second one (both tracked by batch); the
    second is destroyed at once, then made anew and launched into again."""
    commands = ["init", "spread 200 10 2", "destroystream extra", "sleep 5", "spread 200 10 2"]
    run = run_probe(node, LP_VGPU, [*commands, "sync", "deadhandles"])
    assert all(r["rc"] == "0" for r in run.replies if "rc" in r), run.replies
    assert run.reply("deadhandles")["n"] == "0"
    assert node.stats(LP_VGPU)["launches"] == 20


def test_a_refused_destroy_of_the_legacy_stream_drops_nothing(node: NodeOwner) -> None:
    """cuStreamDestroy(CU_STREAM_LEGACY): the driver refuses to destroy a default stream, which
    lives on; low priority keeps tracking it with the slot and fence events it has (before, the
    interposer took the stream for destroyed: its slot was dropped and a new one made, with
    fence events of its own)."""
    burst = ["launch legacy 100 50", "sync", "sleep 5"]
    commands = ["init", *burst * 20, "events", "destroystream legacy", *burst * 20, "events"]
    run = run_probe(node, LP_VGPU, commands)
    assert run.rc("destroystream") != 0
    before, after = (int(run.reply("events", i)["created"]) for i in range(2))
    assert after == before
