"""Graph memory (allocation nodes, and asynchronous allocations captured into a graph) counts
against the vGPU's limit: reserved when the graph is instantiated, for as long as the executable
graph lives. The fake driver (a test double) backs a graph's allocations at its first launch
from a graph memory pool that keeps them until trimmed, as the real driver does."""

from __future__ import annotations

import pytest

from .conftest import SMALL_LIMIT, SMALL_VGPU, NodeOwner, Probe, run_probe

MIB = 1 << 20
QS_EV_OOM = 5
INSTANTIATIONS = ["flags", "v1", "v2", "params", "params_ptsz", "proc", "child"]


def replies(run_cmds: list[dict[str, str]], cmd: str) -> list[int]:
    return [int(r["rc"]) for r in run_cmds if r["cmd"] == cmd]


@pytest.mark.parametrize("how", INSTANTIATIONS)
def test_graph_allocating_past_the_limit_fails_to_instantiate(node: NodeOwner, how: str) -> None:
    run = run_probe(node, SMALL_VGPU, ["init", f"graph alloc {SMALL_LIMIT + MIB} {how}"])
    assert run.rc("graph") == 2  # CUDA_ERROR_OUT_OF_MEMORY
    ooms = node.wait_events(QS_EV_OOM, 1)
    assert [int(e["value"]) for e in ooms] == [SMALL_LIMIT + 2 * MIB]  # at 2 MiB granularity


@pytest.mark.parametrize("style", ["direct", "runtime"])
def test_launched_graph_memory_leaves_no_room_past_the_limit(node: NodeOwner, style: str) -> None:
    run = run_probe(
        node,
        SMALL_VGPU,
        ["init", f"graph alloc {768 * MIB}", "graph launch", f"alloc plain {512 * MIB}", "devused"],
        style=style,
    )
    assert replies(run.replies, "graph") == [0, 0]
    assert run.rc("alloc") == 2
    assert run.device_used() <= SMALL_LIMIT


def test_captured_allocation_counts_once_from_instantiation(node: NodeOwner) -> None:
    run = run_probe(
        node,
        SMALL_VGPU,
        ["init", f"graph capture {768 * MIB}", "graph launch", f"alloc plain {512 * MIB}"],
    )
    assert replies(run.replies, "graph") == [0, 0]
    assert run.rc("alloc") == 2


def test_captured_allocation_left_live_is_not_counted_twice(node: NodeOwner) -> None:
    probe = Probe(node, SMALL_VGPU)
    try:
        assert probe.ask("init")["rc"] == "0"
        captured = probe.ask(f"graph capture {768 * MIB} keep")["rc"]
        held = node.stats(SMALL_VGPU)["mem_used"]
    finally:
        probe.close()
    assert (captured, held) == ("0", 768 * MIB)


def test_captured_graph_holds_its_memory_while_it_lives(node: NodeOwner) -> None:
    probe = Probe(node, SMALL_VGPU)
    try:
        assert probe.ask("init")["rc"] == "0"
        assert probe.ask(f"graph capture {768 * MIB}")["rc"] == "0"
        held = node.stats(SMALL_VGPU)["mem_used"]
        assert probe.ask("graph destroy")["rc"] == "0"
        after = node.stats(SMALL_VGPU)["mem_used"]
    finally:
        probe.close()
    assert (held, after) == (768 * MIB, 0)


def test_destroyed_graph_gives_its_memory_back_to_the_device(node: NodeOwner) -> None:
    run = run_probe(
        node,
        SMALL_VGPU,
        [
            "init",
            f"graph alloc {768 * MIB}",
            "graph launch",
            "graph destroy",
            f"alloc plain {768 * MIB}",
            "devused",
        ],
    )
    assert replies(run.replies, "graph") == [0, 0, 0]
    assert run.rc("alloc") == 0
    assert run.device_used() <= SMALL_LIMIT


def test_graph_allocation_outliving_its_graph_stays_counted_until_freed(node: NodeOwner) -> None:
    run = run_probe(
        node,
        SMALL_VGPU,
        [
            "init",
            f"graph alloc {768 * MIB} keep",
            "graph launch",
            "graph destroy",
            f"alloc plain {512 * MIB}",
            "devused",
            "graph free",
            f"alloc plain {512 * MIB}",
            "devused",
        ],
    )
    assert replies(run.replies, "graph") == [0, 0, 0, 0]
    assert replies(run.replies, "alloc") == [2, 0]
    assert all(int(r["bytes"]) <= SMALL_LIMIT for r in run.replies if r["cmd"] == "devused")


def test_graph_memory_outliving_its_graph_is_not_taken_for_a_live_graphs(node: NodeOwner) -> None:
    """A destroyed graph's allocation left live stays in the graph pool; a live executable graph
    not yet launched holds none of the pool, so its reservation does not cover that memory. The
    settle at the destroy took the pool's count beyond the live graphs' reservations, released
    the outliving allocation's bytes, and the later launch took the device past the limit."""
    run = run_probe(
        node,
        SMALL_VGPU,
        [
            "init",
            f"graph alloc {256 * MIB} keep",
            "graph launch",
            f"graph alloc {512 * MIB}",
            "graph destroyfirst",
            f"alloc plain {512 * MIB}",
            "graph launch",
            "devused",
        ],
    )
    assert replies(run.replies, "graph")[:4] == [0, 0, 0, 0]
    launched_or_refused = run.rc("alloc") == 2 or run.device_used() <= SMALL_LIMIT
    assert launched_or_refused, run.replies


def test_a_destroyed_graphs_handle_given_to_a_new_graph_keeps_the_new_reservation(
    node: NodeOwner,
) -> None:
    """One thread destroys an executable graph while another instantiates one that the driver
    gives the same handle (the fake driver, a test double, reuses it and delays the destroy's
    answer). The destroy untied the newest record of that handle, the new graph's, so the new
    graph lived on with the old one's smaller reservation and its launch went past the limit."""
    run = run_probe(
        node,
        SMALL_VGPU,
        [
            "init",
            f"graph alloc {256 * MIB}",
            f"graph racedestroy {512 * MIB}",
            f"alloc plain {768 * MIB}",
            "graph launch",
            "devused",
        ],
        extra_env={"QSHARE_FAKE_EXEC_DESTROY_DELAY_MS": "200"},
    )
    assert replies(run.replies, "graph")[:2] == [0, 0]
    used = run.device_used()
    assert run.rc("alloc") == 2 or used <= SMALL_LIMIT, (run.rc("alloc"), used // MIB)


def test_a_graph_with_an_empty_node_instantiates_and_counts_its_allocation(
    node: NodeOwner,
) -> None:
    """The driver answers an empty node's type with CU_GRAPH_NODE_TYPE_EMPTY (5) and a child
    graph node's with CU_GRAPH_NODE_TYPE_GRAPH (4); the interposer had the child graph at 5, so
    every graph with an empty node failed to instantiate (its walk asked the empty node for a
    child graph), and a child graph's allocations went uncounted (test_graph_allocating_past_
    the_limit_fails_to_instantiate[child], once the fake answered the driver's values)."""
    probe = Probe(node, SMALL_VGPU)
    try:
        assert probe.ask("init")["rc"] == "0"
        rc = probe.ask(f"graph alloc {256 * MIB} empty")["rc"]
        held = node.stats(SMALL_VGPU)["mem_used"]
    finally:
        probe.close()
    assert (rc, held) == ("0", 256 * MIB)


@pytest.mark.xfail(
    strict=True,
    reason="known over-count (docs/driver.md, Graph memory): a destroy's settle cannot tell a live "
    "graph's memory in the pool from a destroyed graph's without watching launches",
)
def test_a_live_graphs_allocation_is_not_counted_again_for_a_destroyed_graph(
    node: NodeOwner,
) -> None:
    """A live graph left its 256 MiB allocation live in the graph pool; another graph, which
    frees its own allocation, is launched and destroyed. The destroy's settle takes the pool's
    count (the live graph's allocation) for memory the destroyed graph left behind, so the live
    graph's 256 MiB count twice and 768 MiB, which fit beside it, are refused."""
    run = run_probe(
        node,
        SMALL_VGPU,
        [
            "init",
            f"graph alloc {256 * MIB} keep",
            "graph launch",
            f"graph alloc {512 * MIB}",
            "graph launch",
            "graph destroy",
            f"alloc plain {768 * MIB}",
            "devused",
        ],
    )
    assert replies(run.replies, "graph") == [0, 0, 0, 0, 0]
    assert (run.rc("alloc"), run.device_used() // MIB) == (0, 1024)
