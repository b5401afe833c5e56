"""A program with two contexts destroys one: the interposer forgets (and makes anew) only the
events it made in that context; the other context's events stay in use. Before, any destroy
moved one epoch for every context, so each destroy leaked and re-made the events of all of
them (the fake driver counts the events ever created)."""

from __future__ import annotations

from .conftest import HP_VGPU, LP_VGPU, NodeOwner, run_probe

# Short bursts into the probe's stream, each fenced on its own (a marker, then the tail after
# a pause): enough fences that every slot of the stream's fence queue holds an event.
BURSTS = [c for _ in range(20) for c in ("launch kernel 0 1", "sleep 1")]


def test_destroying_one_context_leaves_the_other_contexts_events_in_use(
    node: NodeOwner,
) -> None:
    commands = ["init", *BURSTS, "events", "ctx2 100 50", "events", *BURSTS, "sync", "events"]
    run = run_probe(node, LP_VGPU, [*commands, "deadhandles"])
    assert all(r["rc"] == "0" for r in run.replies if "rc" in r), run.replies
    before, after_destroy, after = (int(run.reply("events", i)["created"]) for i in range(3))
    assert after_destroy > before  # the second context's own fences
    assert after == after_destroy
    assert run.reply("deadhandles")["n"] == "0"


def test_high_priority_never_destroys_its_fence_of_a_context_that_died(node: NodeOwner) -> None:
    """High priority's fence is made in the context of the launch that opens a unit. The
    program's second context opens one (the fence is made there), is destroyed, and the next
    unit opens in the first context: the old fence died with the second context and must be
    forgotten, not destroyed (its epoch is that context's, not the first's)."""
    commands = ["init", "launch kernel 0 1", "sleep 20", "ctx2 100 5", "sleep 20"]
    run = run_probe(node, HP_VGPU, [*commands, "launch kernel 0 1", "sync", "deadhandles"])
    assert all(r["rc"] == "0" for r in run.replies if "rc" in r), run.replies
    assert run.reply("deadhandles")["n"] == "0"


def test_a_refused_destroy_of_no_context_forgets_no_events(node: NodeOwner) -> None:
    """cuCtxDestroy(NULL) names no context and the driver refuses it: every context lives on,
    so the interposer's events do too, and destroying the program's streams then destroys the
    fence events of their slots (before, the interposer took the call for the death of every
    context and forgot every event it held: they were never destroyed, a leak)."""
    commands = ["init", "spread 100 200 4", "sync", "sleep 5", "destroynull", "events"]
    run = run_probe(node, LP_VGPU, [*commands, "destroystream extra", "sleep 20", "events"])
    assert run.rc("destroynull") != 0 and run.rc("destroystream") == 0
    before, after = (int(run.reply("events", i)["n"]) for i in range(2))
    assert after < before
