"""Memory a pool keeps after cuMemFreeAsync (until a synchronization finds it over its release
threshold, or until it is trimmed) stays counted against the vGPU's limit. The fake driver (a
test double) keeps freed pool memory as the real driver's pools do."""

from __future__ import annotations

from .conftest import SMALL_LIMIT, SMALL_VGPU, NodeOwner, Probe, run_probe

MIB = 1 << 20
KEEP_ALL = 1 << 62


def test_memory_a_pool_keeps_cannot_be_allocated_again(node: NodeOwner) -> None:
    run = run_probe(
        node,
        SMALL_VGPU,
        [
            "init",
            f"pool threshold {KEEP_ALL}",
            f"alloc async {768 * MIB}",
            "free 0",
            "sync",
            f"alloc plain {512 * MIB}",
            "devused",
        ],
    )
    assert run.rc("alloc", 1) == 2  # CUDA_ERROR_OUT_OF_MEMORY
    assert run.device_used() <= SMALL_LIMIT


def test_memory_freed_and_not_yet_given_back_stays_counted(node: NodeOwner) -> None:
    run = run_probe(
        node,
        SMALL_VGPU,
        ["init", f"alloc pool {768 * MIB}", "free 0", f"alloc plain {512 * MIB}", "devused"],
    )
    assert run.rc("alloc", 1) == 2
    assert run.device_used() <= SMALL_LIMIT


def test_memory_the_pool_gave_back_can_be_allocated_again(node: NodeOwner) -> None:
    run = run_probe(
        node,
        SMALL_VGPU,
        [
            "init",
            f"pool threshold {KEEP_ALL}",
            f"alloc async {768 * MIB}",
            "free 0",
            "pool trim 0",
            f"alloc plain {768 * MIB}",
            "free 1",
            f"alloc async {512 * MIB}",
            "free 2",
            "pool threshold 0",
            "sync",
            f"alloc vmm {1024 * MIB}",
        ],
    )
    assert [int(r["rc"]) for r in run.replies if r["cmd"] == "alloc"] == [0, 0, 0, 0]
    assert node.stats(SMALL_VGPU)["mem_used"] == 0


def test_memory_a_pool_keeps_serves_that_pools_next_allocation(node: NodeOwner) -> None:
    """The stream-ordered allocator's loop at the limit (allocate, free, allocate again before
    any synchronization): the pool hands its kept memory out again, so the second allocation
    needs no more of the limit."""
    run = run_probe(
        node,
        SMALL_VGPU,
        ["init", f"alloc async {768 * MIB}", "free 0", f"alloc async {768 * MIB}", "devused"],
    )
    assert run.rc("alloc", 1) == 0
    assert run.device_used() <= SMALL_LIMIT


def test_an_allocation_the_pool_grew_for_past_the_limit_is_refused_and_given_back(
    node: NodeOwner,
) -> None:
    """When what the pool keeps cannot serve the allocation (the fake's pool told not to reuse:
    kept in pieces, or for another stream), the pool grows: the allocation is refused and the
    pool gives back what it holds beyond the vGPU's reservation."""
    run = run_probe(
        node,
        SMALL_VGPU,
        ["init", f"alloc async {768 * MIB}", "free 0", f"alloc async {768 * MIB}", "devused"],
        extra_env={"QSHARE_FAKE_POOL_NO_REUSE": "1"},
    )
    assert run.rc("alloc", 1) == 2
    assert run.device_used() <= SMALL_LIMIT


def test_two_threads_allocating_the_limit_from_one_pool_are_both_served(node: NodeOwner) -> None:
    """Two threads allocate half the limit each from the same pool at once; both reserve before
    the driver runs, and the pool grows for both before either is answered (the fake driver, a
    test double, holds its answer). The first answered read the pool's count with the other's
    growth in it and took that for its own: it reserved the other's bytes again, found no room,
    and was refused although the two together fit the limit."""
    run = run_probe(
        node,
        SMALL_VGPU,
        ["init", f"asyncpair {SMALL_LIMIT // 2}", "devused"],
        extra_env={"QSHARE_FAKE_POOL_ALLOC_DELAY_MS": "200"},
    )
    assert (run.rc("asyncpair"), int(run.reply("asyncpair")["rc2"])) == (0, 0)
    assert run.device_used() <= SMALL_LIMIT


def test_a_freed_address_allocated_again_meanwhile_keeps_both_accounts(node: NodeOwner) -> None:
    """One thread frees a stream-ordered allocation while another allocates from the same pool
    and gets the freed address back (the fake driver, a test double, hands it out again and
    delays the free's answer). The free looked its allocation up after the driver's free, took
    the new allocation's record for it, and left its own bytes counted for good: with
    everything freed and the pool emptied, the limit could no longer be allocated whole."""
    run = run_probe(
        node,
        SMALL_VGPU,
        [
            "init",
            f"alloc async {512 * MIB}",
            f"freerace 0 {512 * MIB}",
            "free 1",
            "sync",
            f"alloc plain {SMALL_LIMIT}",
        ],
        extra_env={"QSHARE_FAKE_FREE_DELAY_MS": "200"},
    )
    race = run.reply("freerace")
    assert (race["rc"], race["rc2"], race["id"]) == ("0", "0", "1")
    assert run.rc("free") == 0
    assert run.rc("alloc", 1) == 0


def test_a_released_handle_created_again_meanwhile_keeps_both_accounts(node: NodeOwner) -> None:
    """The same race on VMM handles: one thread's cuMemRelease and another's cuMemCreate given
    the freed handle (the fake driver hands it out again and delays the release's answer)."""
    run = run_probe(
        node,
        SMALL_VGPU,
        [
            "init",
            f"alloc vmm {512 * MIB}",
            f"freerace 0 {512 * MIB}",
            "free 1",
            f"alloc plain {SMALL_LIMIT}",
        ],
        extra_env={"QSHARE_FAKE_FREE_DELAY_MS": "200"},
    )
    race = run.reply("freerace")
    assert (race["rc"], race["rc2"], race["id"]) == ("0", "0", "1")
    assert run.rc("free") == 0
    assert run.rc("alloc", 1) == 0


def test_an_allocation_refused_after_coming_from_another_pool_leaves_no_memory_uncounted(
    node: NodeOwner,
) -> None:
    """cuMemAllocAsync draws on what the current device's pool keeps, but the allocation came
    from another pool (the fake driver, a test double, told to take it from a second pool, as
    for a stream of another device). The reservation of what was drawn then does not fit: the
    allocation is freed into the pool it came from, and refused. That pool kept the freed bytes
    while their reservation was given back: the card held 1.25 GiB under a 1 GiB limit."""
    probe = Probe(node, SMALL_VGPU, extra_env={"QSHARE_FAKE_ASYNC_OTHER_POOL": "1"})
    try:
        assert probe.ask("init")["rc"] == "0"
        assert probe.ask(f"alloc pool {512 * MIB}")["rc"] == "0"
        assert probe.ask("free 0")["rc"] == "0"
        assert probe.ask(f"alloc plain {256 * MIB}")["rc"] == "0"
        refused = probe.ask(f"alloc async {512 * MIB}")["rc"]
        used = int(probe.ask("devused")["bytes"])
        counted = node.stats(SMALL_VGPU)["mem_used"]
    finally:
        probe.close()
    assert refused == "2"  # CUDA_ERROR_OUT_OF_MEMORY
    assert (used // MIB, counted // MIB) == (768, 768)


def test_an_allocation_refused_after_the_pool_grew_is_freed_even_when_its_stream_refuses(
    node: NodeOwner,
) -> None:
    """The pool grew past the limit for an allocation (its kept memory cannot serve it), so the
    allocation is refused and freed; the driver refuses the free on its stream (the fake driver,
    a test double, told to refuse stream-ordered frees from the second on, as for a stream
    destroyed meanwhile). The allocation lived on, counted, while the program was told it was out
    of memory and never learns its address: after everything else was freed and the pool gave
    its memory back, the limit could no longer be allocated whole."""
    run = run_probe(
        node,
        SMALL_VGPU,
        [
            "init",
            f"alloc async {768 * MIB}",
            "free 0",
            f"alloc async {768 * MIB}",
            "sync",
            "devused",
            f"alloc plain {SMALL_LIMIT}",
        ],
        extra_env={"QSHARE_FAKE_POOL_NO_REUSE": "1", "QSHARE_FAKE_FREE_ASYNC_FAILS_FROM": "2"},
    )
    assert [int(r["rc"]) for r in run.replies if r["cmd"] == "alloc"] == [0, 2, 0]
    assert run.device_used() == 0
