"""The priority gate through the interposer: a unit of work lasts from its launch until
it completes on the device, high priority never waits, low priority yields to it."""

from __future__ import annotations

import time

import pytest

from .conftest import HP_VGPU, LP_VGPU, NodeOwner, Probe, run_probe

MS = 1_000_000
QS_EV_IDLE = 2


@pytest.fixture
def hp(node: NodeOwner) -> Probe:
    probe = Probe(node, HP_VGPU)
    assert probe.ask("init")["rc"] == "0"
    return probe


@pytest.fixture
def lp(node: NodeOwner) -> Probe:
    probe = Probe(node, LP_VGPU)
    assert probe.ask("init")["rc"] == "0"
    return probe


def test_low_priority_launch_waits_until_high_priority_work_completes(hp: Probe, lp: Probe) -> None:
    started = int(hp.ask("launch kernel 300000 1")["start"])  # a 300 ms kernel, in flight
    lp_launch = lp.ask("launch kernel 0 1")
    assert lp_launch["rc"] == "0"
    assert int(lp_launch["t"]) >= started + 300 * MS
    hp.close()
    lp.close()


def test_high_priority_stays_busy_until_its_work_completes(node: NodeOwner, hp: Probe) -> None:
    started = int(hp.ask("launch kernel 200000 1")["start"])
    hp.ask("sync")
    idle = node.wait_events(QS_EV_IDLE, 1, timeout=10)[0]
    assert int(idle["time"]) >= started + 200 * MS
    assert int(idle["value"]) >= 200 * MS  # busy for at least the kernel's duration
    hp.close()


def test_high_priority_stays_busy_until_its_last_queued_kernel_completes(
    hp: Probe, lp: Probe
) -> None:
    started = int(hp.ask("launch kernel 50000 4")["start"])  # four 50 ms kernels, one unit
    lp_launch = lp.ask("launch kernel 0 1")
    assert lp_launch["rc"] == "0"
    assert int(lp_launch["t"]) >= started + 200 * MS
    hp.close()
    lp.close()


def test_low_priority_work_in_flight_is_bounded(lp: Probe) -> None:
    launch = lp.ask("launch kernel 50000 12")  # twelve 50 ms kernels against the default window
    # before any is measured the window admits 8 launches; the last 4 waited for completions
    assert int(launch["t"]) >= int(launch["start"]) + 200 * MS
    lp.close()


def test_suspended_vgpu_launches_only_after_resume(node: NodeOwner, lp: Probe) -> None:
    assert node.command(f"suspend {LP_VGPU}")["rc"] == "0"
    lp.send("launch kernel 0 1")
    time.sleep(0.1)
    resumed_at = time.monotonic_ns()
    assert node.command(f"resume {LP_VGPU}")["rc"] == "0"
    assert int(lp.receive()["t"]) >= resumed_at
    lp.close()


def test_low_priority_device_time_is_accounted(node: NodeOwner, lp: Probe) -> None:
    lp.ask("launch kernel 20000 3")
    lp.ask("sync")
    deadline = time.monotonic() + 10  # the last unit is ended by the completion thread
    while node.stats(LP_VGPU)["device_ns"] < 60 * MS and time.monotonic() < deadline:
        time.sleep(0.02)
    assert node.stats(LP_VGPU)["device_ns"] >= 60 * MS
    lp.close()


@pytest.mark.parametrize("kind", ["kernel", "ex", "coop", "graph", "host"])
def test_every_kind_of_submission_passes_the_gate(node: NodeOwner, kind: str) -> None:
    run = run_probe(node, LP_VGPU, ["init", f"launch {kind} 0 3", "sync"])
    assert run.rc("launch") == 0
    assert node.stats(LP_VGPU)["launches"] == 3


@pytest.mark.parametrize("style", ["runtime", "runtime-per-thread"])
def test_launches_found_through_get_proc_address_pass_the_gate(node: NodeOwner, style: str) -> None:
    run_probe(node, LP_VGPU, ["init", "launch ex 0 2", "launch host 0 2", "sync"], style=style)
    assert node.stats(LP_VGPU)["launches"] == 4
