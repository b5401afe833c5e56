"""The vGPU's memory limit holds on every allocation path, across processes."""

from __future__ import annotations

import pytest

from .conftest import (
    LP_LIMIT,
    LP_VGPU,
    SMALL_LIMIT,
    SMALL_VGPU,
    NodeOwner,
    Probe,
    run_probe,
)

KINDS = ["plain", "pitch", "managed", "async", "pool", "vmm", "array", "array3d"]
QS_EV_OOM = 5
MIB = 1 << 20


@pytest.mark.parametrize("kind", KINDS)
def test_allocation_over_the_limit_returns_out_of_memory(node: NodeOwner, kind: str) -> None:
    run = run_probe(node, LP_VGPU, ["init", f"alloc {kind} {LP_LIMIT + 4096}"])
    assert run.rc("alloc") == 2


@pytest.mark.parametrize("kind", KINDS)
def test_allocation_within_the_limit_is_counted_and_freed(node: NodeOwner, kind: str) -> None:
    run = run_probe(node, LP_VGPU, ["init", f"alloc {kind} {64 * MIB}", "meminfo", "free 0"])
    assert run.rc("alloc") == 0
    assert int(run.reply("meminfo")["free"]) <= LP_LIMIT - 64 * MIB
    assert run.rc("free") == 0
    assert node.stats(LP_VGPU)["mem_used"] == 0


def test_freed_memory_can_be_allocated_again(node: NodeOwner) -> None:
    size = LP_LIMIT * 3 // 4
    run = run_probe(node, LP_VGPU, ["init", f"alloc plain {size}", "free 0", f"alloc vmm {size}"])
    assert [r["rc"] for r in run.replies if r["cmd"] == "alloc"] == ["0", "0"]


def test_refused_allocation_records_an_oom_event(node: NodeOwner) -> None:
    run_probe(node, SMALL_VGPU, ["init", f"alloc plain {SMALL_LIMIT + 1}"])
    ooms = node.wait_events(QS_EV_OOM, 1)
    assert [(int(e["vgpu"]), int(e["value"])) for e in ooms] == [(SMALL_VGPU, SMALL_LIMIT + 1)]


def test_processes_racing_for_the_last_bytes_never_exceed_the_limit(node: NodeOwner) -> None:
    chunk = SMALL_LIMIT // 4
    probes = [Probe(node, SMALL_VGPU) for _ in range(8)]
    for probe in probes:
        probe.send("init")
    for probe in probes:
        probe.receive()
    for probe in probes:  # every process asks before any answer is read: they race
        for _ in range(3):
            probe.send(f"alloc plain {chunk}")
    granted = sum(probe.receive()["rc"] == "0" for probe in probes for _ in range(3))
    used = node.stats(SMALL_VGPU)["mem_used"]
    for probe in probes:
        probe.close()
    assert (granted, used) == (4, SMALL_LIMIT)


def test_memory_of_an_exited_process_returns_to_the_vgpu(node: NodeOwner) -> None:
    run_probe(node, SMALL_VGPU, ["init", f"alloc plain {SMALL_LIMIT}"])
    again = run_probe(node, SMALL_VGPU, ["init", f"alloc plain {SMALL_LIMIT}"])
    assert again.rc("alloc") == 0


def racing_pair(node: NodeOwner, bytes_each: int) -> tuple[int, int]:
    """512 MiB a pool kept and gave back at a synchronization are still reserved (the interposer
    settles them only when a reservation finds no room); then two threads allocate `bytes_each`
    with cuMemAlloc at once while another process holds the vGPU's memory lock (the C test node,
    standing in for a tenant reserving), so that both check for room before either reserves."""
    probe = Probe(node, SMALL_VGPU)
    try:
        assert probe.ask("init")["rc"] == "0"
        assert probe.ask(f"alloc async {512 * MIB}")["rc"] == "0"
        assert probe.ask("free 0")["rc"] == "0"
        assert probe.ask("sync")["rc"] == "0"
        assert node.command(f"memhold {SMALL_VGPU} 300")["rc"] == "0"
        pair = probe.ask(f"allocpair {bytes_each}")
    finally:
        probe.close()
    return int(pair["rc"]), int(pair["rc2"])


def test_allocations_racing_for_room_a_pool_gave_back_are_both_served(node: NodeOwner) -> None:
    """Each of the two fits beside the stale reservation, both fit once it is settled. Both found
    room, skipped the settle, and the second to reserve was refused although both fit."""
    assert racing_pair(node, 300 * MIB) == (0, 0)


def test_allocations_racing_for_the_last_bytes_never_pass_the_limit(node: NodeOwner) -> None:
    """Guard (exact check-and-add under the vGPU's lock): when only one of the two fits even
    once the pool's memory is settled, one of them is refused, never both served."""
    assert sorted(racing_pair(node, 600 * MIB)) == [0, 2]
