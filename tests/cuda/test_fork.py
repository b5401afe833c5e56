"""A process forks while its launches are in flight, and the child uses CUDA: the child gets
from the interposer what it would get without it (the driver's answer), never a hang on the
parent's launches, which only the parent's threads can see complete."""

from __future__ import annotations

import pytest

from .conftest import HP_VGPU, LP_VGPU, NodeOwner, run_probe


@pytest.mark.parametrize("vgpu", [HP_VGPU, LP_VGPU], ids=["high", "low"])
def test_a_child_forked_with_launches_in_flight_gets_the_drivers_answer(
    node: NodeOwner, vgpu: int
) -> None:
    """The parent's 8 kernels of 20 ms fill low priority's 20 ms window; the child's launch
    returns (the fake driver, like the real one, refuses CUDA in a child forked after the
    parent initialized it)."""
    run = run_probe(node, vgpu, ["init", "launch kernel 20000 8", "forklaunch 0", "sync"])
    assert run.rc("launch") == 0 and run.rc("forklaunch") == 0
    assert run.reply("forklaunch")["hung"] == "0"
    assert run.rc("forkchild") == 3  # CUDA_ERROR_NOT_INITIALIZED
    assert run.rc("sync") == 0


def test_a_low_priority_child_forked_with_two_streams_in_flight_gets_the_drivers_answer(
    node: NodeOwner,
) -> None:
    """The parent's kernels of 20 ms over two streams fill the shared window."""
    run = run_probe(node, LP_VGPU, ["init", "spread 20000 8 2", "forklaunch 0", "sync"])
    assert run.rc("spread") == 0 and run.rc("forklaunch") == 0
    assert run.reply("forklaunch")["hung"] == "0"
    assert run.rc("forkchild") == 3  # CUDA_ERROR_NOT_INITIALIZED
    assert run.rc("sync") == 0
