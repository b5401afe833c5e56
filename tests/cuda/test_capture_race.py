"""A capture begins on a stream between a completion thread's question whether it may record
a fence there and the recording (the fake driver holds that thread's first answer 300 ms to
open the gap): the program's cuStreamBeginCapture waits for the recording, so the fence is not
taken into the program's graph (where it would never complete, and would be recorded again
at every launch of the graph)."""

from __future__ import annotations

import pytest

from .conftest import HP_VGPU, LP_VGPU, NodeOwner, run_probe

DELAY = {"QSHARE_FAKE_CAPTURE_QUERY_DELAY_MS": "300"}


@pytest.mark.parametrize("vgpu", [HP_VGPU, LP_VGPU], ids=["high", "low"])
def test_a_capture_begun_during_a_fences_recording_does_not_take_the_fence(
    node: NodeOwner, vgpu: int
) -> None:
    """Low priority's tail fence, high priority's re-recorded fence: each is recorded by a
    completion thread into the probe's stream, which the probe begins to capture 20 ms after
    its launches, while that thread's question is held."""
    commands = ["init", "launch kernel 2000 5", "sleep 20", "capture begin probe", "sleep 400"]
    run = run_probe(node, vgpu, [*commands, "capture end", "captured", "sync"], extra_env=DELAY)
    assert run.rc("launch") == 0 and run.rc("capture", 0) == 0 and run.rc("capture", 1) == 0
    assert run.reply("captured")["n"] == "0"
    assert run.rc("sync") == 0
