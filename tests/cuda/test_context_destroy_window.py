"""Low priority's window across a context destroy, through the interposer and the fake driver:
the destroyed context's queued launches stay in the window until the driver's destroy has
drained them, so launches into another context cannot queue a second window meanwhile."""

from __future__ import annotations

from .conftest import LP_VGPU, NodeOwner, run_probe

MS = 1_000_000
WINDOW_MS = 20  # the window while no high-priority process is attached


def test_a_destroyed_contexts_queued_work_holds_the_window_until_the_destroy_returns(
    node: NodeOwner,
) -> None:
    """30 kernels of 2 ms queued into a second context fill the 20 ms window; a thread then
    launches 30 more into the first context while the second is destroyed (the driver waits
    for its work). The device never has much over one window queued. Before, the destroy
    ended the second context's launches at once, and the thread queued a second window
    beside the one still draining (about 40 ms)."""
    run = run_probe(node, LP_VGPU, ["init", "ctxrace 2000 30"])
    assert run.returncode == 0, run.stderr
    assert run.rc("ctxrace") == 0
    assert int(run.reply("ctxrace")["queued_max_ns"]) <= (WINDOW_MS + 10) * MS
    assert node.stats(LP_VGPU)["launches"] == 60
