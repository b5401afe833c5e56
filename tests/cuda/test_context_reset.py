"""The program resets its primary context (cudaDeviceReset), which destroys every stream and
event made in it, the interposer's included, and goes on: the interposer makes its events
anew (it never hands the driver a dead handle), and high priority's work still holds low
priority off until it completes. (The program resets once its work is done and the
interposer's completion threads have seen it done: a completion thread still inside a wait
when the context is destroyed is a limit named in docs/cuda.md.)"""

from __future__ import annotations

import pytest

from .conftest import HP_VGPU, LP_VGPU, NodeOwner, Probe, run_probe

MS = 1_000_000

# Launches of each path before the reset, so that the interposer holds events of each:
# the tracked stream (the default one), and one unit per launch (the probe's own stream),
# more of them than the ring of units has slots, so that its slots hold events.
BEFORE = ["init", "launch default 1000 5", "launch kernel 10 1100", "sync", "sleep 5"]
AFTER = ["launch default 1000 5", "launch kernel 10 1100", "launch default 0 1", "sync"]


@pytest.mark.parametrize("how", ["reset", "reset release"], ids=["reset", "last-release"])
@pytest.mark.parametrize("vgpu", [HP_VGPU, LP_VGPU], ids=["high", "low"])
def test_after_a_reset_the_interposer_uses_no_handle_of_the_destroyed_context(
    node: NodeOwner, vgpu: int, how: str
) -> None:
    """`reset release`: the program releases its only reference to the primary context,
    which destroys it as a reset does."""
    run = run_probe(node, vgpu, [*BEFORE, how, *AFTER, "deadhandles"])
    assert all(r["rc"] == "0" for r in run.replies if "rc" in r), run.replies
    assert run.reply("deadhandles")["n"] == "0"


def test_high_priority_holds_low_priority_off_after_a_reset(node: NodeOwner) -> None:
    hp, lp = Probe(node, HP_VGPU), Probe(node, LP_VGPU)
    try:
        for command in [*BEFORE, "reset"]:
            assert hp.ask(command)["rc"] == "0"
        assert lp.ask("init")["rc"] == "0"
        started = int(hp.ask("launch kernel 300000 1")["start"])  # a 300 ms kernel
        lp_launch = lp.ask("launch kernel 0 1")
        assert lp_launch["rc"] == "0"
        assert int(lp_launch["t"]) >= started + 300 * MS
    finally:
        hp.close()
        lp.close()
