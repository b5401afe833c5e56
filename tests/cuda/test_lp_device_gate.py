"""Low priority's device gate (QSHARE_LP_DEVICE_GATE=1), through the interposer and the fake
driver: queued low-priority work waits on the card's gate word on the device, so it stops
when high priority closes the gate even though it was submitted before, and resumes on its
own when the release reopens it; the process keeps its deep window beside high priority."""

from __future__ import annotations

import json
import select
import time
from pathlib import Path
from typing import Any

from .conftest import HP_VGPU, LP_VGPU, NodeOwner, Probe, run_probe, start_node

MS = 1_000_000
GATE_ON = {"QSHARE_LP_DEVICE_GATE": "1"}
LP_KERNELS = 6  # of 20 ms each: 120 ms of queued work


def kernels_done(probe: Probe) -> int:
    return int(probe.ask("kernels")["n"])


def queue_then_preempt(
    node: NodeOwner, hp_probe: Probe, env: dict[str, str]
) -> tuple[Probe, int, int]:
    """LP queues LP_KERNELS kernels of 20 ms, then HP runs a 300 ms kernel: LP's kernels done
    100 ms and 200 ms into HP's run."""
    lp = Probe(node, LP_VGPU, extra_env=env)
    assert lp.ask("init")["rc"] == "0"
    assert lp.ask(f"launch kernel 20000 {LP_KERNELS}")["rc"] == "0"
    assert hp_probe.ask("launch kernel 300000 1")["rc"] == "0"
    time.sleep(0.1)
    early = kernels_done(lp)
    time.sleep(0.1)
    return lp, early, kernels_done(lp)


def test_queued_low_priority_work_is_held_on_the_device_while_high_priority_runs(
    node: NodeOwner, hp_probe: Probe
) -> None:
    lp, early, late = queue_then_preempt(node, hp_probe, GATE_ON)
    try:
        assert early == late < LP_KERNELS
    finally:
        lp.close()


def preempt_then_finish(node: NodeOwner, hp_probe: Probe) -> int:
    """queue_then_preempt with the device gate, then both finish: LP's kernels run in all."""
    lp, _, _ = queue_then_preempt(node, hp_probe, GATE_ON)
    try:
        assert hp_probe.ask("sync")["rc"] == "0"
        assert lp.ask("sync")["rc"] == "0"
        return kernels_done(lp)
    finally:
        lp.close()


def test_held_low_priority_work_resumes_once_the_gate_reopens(
    node: NodeOwner, hp_probe: Probe
) -> None:
    assert preempt_then_finish(node, hp_probe) == LP_KERNELS


def test_low_priority_is_not_charged_for_the_time_its_queue_was_held(
    node: NodeOwner, hp_probe: Probe
) -> None:
    """120 ms of kernels held for about 300 ms: the vGPU is charged for the kernels."""
    preempt_then_finish(node, hp_probe)
    assert node.stats(LP_VGPU)["device_ns"] < 250 * MS


def test_without_the_device_gate_queued_work_runs_through_high_priority(
    node: NodeOwner, hp_probe: Probe
) -> None:
    """The contrast: the host gate only stops launches not yet made."""
    lp, _, late = queue_then_preempt(node, hp_probe, {})
    try:
        assert late == LP_KERNELS
    finally:
        lp.close()


def test_the_device_gate_keeps_the_deep_window_beside_high_priority(
    node: NodeOwner, hp_probe: Probe, tmp_path: Path
) -> None:
    path = tmp_path / "stats.json"
    env = GATE_ON | {"QSHARE_STATS_FILE": str(path)}
    commands = ["init", "launch kernel 1000 30", "sync"]
    run = run_probe(node, LP_VGPU, commands, extra_env=env)
    assert run.returncode == 0, run.stderr
    stats = json.loads(path.read_text())
    assert stats["lp_window_ns"] == 20 * MS
    assert stats["lp_device_gate_waits"] >= 1


def lp_stats(node: NodeOwner, env: dict[str, str], tmp_path: Path) -> tuple[dict[str, Any], str]:
    """The statistics and stderr of an LP process that runs 10 kernels of 1 ms."""
    path = tmp_path / "stats.json"
    env = env | {"QSHARE_STATS_FILE": str(path)}
    run = run_probe(node, LP_VGPU, ["init", "launch kernel 1000 10", "sync"], extra_env=env)
    assert run.returncode == 0 and run.rc("launch") == 0, run.stderr
    return json.loads(path.read_text()), run.stderr


def test_an_unknown_device_gate_setting_is_named_and_the_cards_holds(
    node: NodeOwner, hp_probe: Probe, tmp_path: Path
) -> None:
    stats, stderr = lp_stats(node, {"QSHARE_LP_DEVICE_GATE": "yes"}, tmp_path)
    assert "QSHARE_LP_DEVICE_GATE='yes' is neither 0 nor 1" in stderr
    assert stats["lp_device_gate_waits"] == 0


def test_the_cards_device_gate_turns_it_on_for_its_processes(
    node: NodeOwner, hp_probe: Probe, tmp_path: Path
) -> None:
    assert node.command("devgate 0 1")["lp_device_gate"] == "1"
    stats, _ = lp_stats(node, {}, tmp_path)
    assert stats["lp_device_gate_waits"] >= 1
    assert stats["lp_window_ns"] == 20 * MS


def test_a_process_can_turn_the_cards_device_gate_off_for_itself(
    node: NodeOwner, hp_probe: Probe, tmp_path: Path
) -> None:
    assert node.command("devgate 0 1")["rc"] == "0"
    stats, _ = lp_stats(node, {"QSHARE_LP_DEVICE_GATE": "0"}, tmp_path)
    assert stats["lp_device_gate_waits"] == 0
    assert stats["lp_window_ns"] == MS // 2


def test_a_driver_that_cannot_register_the_gate_word_leaves_the_window_in_force(
    node: NodeOwner, hp_probe: Probe, tmp_path: Path
) -> None:
    path = tmp_path / "stats.json"
    env = GATE_ON | {"QSHARE_FAKE_NO_HOST_REGISTER": "1", "QSHARE_STATS_FILE": str(path)}
    run = run_probe(node, LP_VGPU, ["init", "launch kernel 1000 10", "sync"], extra_env=env)
    assert run.returncode == 0 and run.rc("launch") == 0
    assert "the low-priority device gate is off: registering the gate word" in run.stderr
    stats = json.loads(path.read_text())
    assert stats["lp_device_gate_waits"] == 0
    assert stats["lp_window_ns"] == MS // 2


def test_queued_work_is_held_after_the_first_stream_is_destroyed(
    node: NodeOwner, hp_probe: Probe
) -> None:
    """The gate waits go into one stream, the first bound. The program destroys it while its
    50 ms kernel still runs (its slot is not yet free) and queues into a new stream: the waits
    move to the new stream, so its queued work is held while high priority runs. Before, they
    stayed with the destroyed stream's slot and the new stream's work ran through."""
    lp = Probe(node, LP_VGPU, extra_env=GATE_ON)
    try:
        for command in ["init", "launch kernel 50000 1", "destroystream probe"]:
            assert lp.ask(command)["rc"] == "0"
        assert lp.ask(f"launch kernel 20000 {LP_KERNELS}")["rc"] == "0"
        assert hp_probe.ask("launch kernel 300000 1")["rc"] == "0"
        time.sleep(0.1)
        early = kernels_done(lp)
        time.sleep(0.1)
        assert early == kernels_done(lp) < LP_KERNELS + 1
    finally:
        lp.close()


def test_every_stream_of_the_process_is_held_on_the_device_while_high_priority_runs(
    node: NodeOwner, hp_probe: Probe
) -> None:
    """Kernels of 2 ms alternate between two streams until the 20 ms window holds the launch
    loop, then high priority runs a 300 ms kernel: each stream ends the kernel it is in and
    holds the rest of its queue (about 5 kernels each). Before, only the first stream the
    process launched into waited on the device, and the second's queue ran through."""
    lp = Probe(node, LP_VGPU, extra_env=GATE_ON)
    try:
        assert lp.ask("init")["rc"] == "0"
        assert lp.ask("alternate 2000 100 0 1")["rc"] == "0"
        assert hp_probe.ask("launch kernel 300000 1")["rc"] == "0"
        before = kernels_done(lp)
        time.sleep(0.1)
        early = kernels_done(lp)
        time.sleep(0.1)
        late = kernels_done(lp)
        assert early == late <= before + 3
    finally:
        lp.close()


def reply_within(probe: Probe, command: str, seconds: float) -> dict[str, str] | None:
    """The probe's reply to `command`, or None when it gives none within `seconds`."""
    assert probe.process.stdout is not None
    probe.send(command)
    ready, _, _ = select.select([probe.process.stdout], [], [], seconds)
    return probe.receive() if ready else None


def test_held_work_resumes_when_the_owner_died_while_high_priority_held_the_gate(
    cuda_build: Path, tmp_path: Path
) -> None:
    """The owner (whose release thread reopens the gate) is killed while high priority's 300 ms
    kernel holds low priority's queue on the device. Once high priority has been quiet for the
    release delay (20 ms), the low-priority process reopens the gate itself and its queue runs.
    Before, nothing reopened it: the queue stayed held, and the program's synchronize with it,
    until an owner adopted the segment."""
    node = start_node(tmp_path)
    hp = Probe(node, HP_VGPU)
    lp = Probe(node, LP_VGPU, extra_env=GATE_ON)
    try:
        assert hp.ask("init")["rc"] == "0" and lp.ask("init")["rc"] == "0"
        assert lp.ask(f"launch kernel 20000 {LP_KERNELS}")["rc"] == "0"
        assert hp.ask("launch kernel 300000 1")["rc"] == "0"
        time.sleep(0.05)
        node.process.kill()
        node.process.wait(timeout=10)
        synced = reply_within(lp, "sync", 5.0)
        assert synced is not None and synced["rc"] == "0"
        assert kernels_done(lp) == LP_KERNELS
    finally:
        for probe in (hp, lp):
            probe.process.kill()
            probe.process.wait(timeout=10)
