"""How a process under the interposer leaves its vGPU: a normal exit detaches (the owner
records `detach`), a kill is a death (`client_died`, reaped by the owner), and neither a
thread still launching nor a forked child turns one into the other or hangs the exit."""

from __future__ import annotations

import signal
import time

from .conftest import HP_VGPU, LP_VGPU, NodeOwner, Probe, run_probe

QS_EV_DETACH = 7
QS_EV_CLIENT_DIED = 8
SECOND = 1_000_000_000
MS = 1_000_000


def events_of(node: NodeOwner, kind: int, vgpu: int) -> list[dict[str, str]]:
    return [e for e in node.events(kind) if int(e["vgpu"]) == vgpu]


def ends_of(node: NodeOwner, vgpu: int, timeout: float = 5.0) -> list[dict[str, str]]:
    """The detach and client_died events of `vgpu`, once there is one (or at `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        found = events_of(node, QS_EV_DETACH, vgpu) + events_of(node, QS_EV_CLIENT_DIED, vgpu)
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def test_clean_exit_detaches_once_and_is_no_death(node: NodeOwner) -> None:
    lp = Probe(node, LP_VGPU)
    assert lp.ask("init")["rc"] == "0"
    assert lp.ask("launch kernel 100 20")["rc"] == "0"
    lp.close()  # returns from main
    detached = node.wait_events(QS_EV_DETACH, 1)
    assert [int(e["pid"]) for e in detached] == [lp.process.pid]
    assert node.events(QS_EV_CLIENT_DIED) == []


def test_high_priority_clean_exit_detaches(node: NodeOwner) -> None:
    run = run_probe(node, HP_VGPU, ["init", "launch kernel 100 20", "sync"])
    assert run.returncode == 0, run.stderr
    assert len(node.wait_events(QS_EV_DETACH, 1)) == 1
    assert node.events(QS_EV_CLIENT_DIED) == []


def test_killed_process_is_reported_dead_not_detached(node: NodeOwner) -> None:
    lp = Probe(node, LP_VGPU)
    assert lp.ask("init")["rc"] == "0"
    assert lp.ask("launch kernel 100 20")["rc"] == "0"
    lp.process.send_signal(signal.SIGKILL)
    lp.process.wait(timeout=10)
    died = node.wait_events(QS_EV_CLIENT_DIED, 1)
    assert [int(e["pid"]) for e in died] == [lp.process.pid]
    assert node.events(QS_EV_DETACH) == []


def test_exit_while_another_thread_launches_detaches(node: NodeOwner) -> None:
    run = run_probe(node, LP_VGPU, ["init", "spin 0", "launch kernel 10 50"])
    assert run.returncode == 0, run.stderr
    assert run.rc("spin") == 0
    assert len(node.wait_events(QS_EV_DETACH, 1)) == 1
    assert node.events(QS_EV_CLIENT_DIED) == []


def test_exit_while_another_thread_is_held_in_a_launch_is_a_death_without_waiting_for_it(
    node: NodeOwner,
) -> None:
    run = run_probe(node, LP_VGPU, ["init", "hold"])  # that launch never returns
    assert run.returncode == 0, run.stderr
    assert run.rc("hold") == 0
    assert "records this exit as the process's death" in run.stderr
    assert len(node.wait_events(QS_EV_CLIENT_DIED, 1)) == 1
    assert node.events(QS_EV_DETACH) == []


def test_exit_while_a_thread_launches_into_a_closed_gate_does_not_wait_for_the_gate(
    node: NodeOwner,
) -> None:
    lp = Probe(node, LP_VGPU)
    assert lp.ask("init")["rc"] == "0"
    assert lp.ask("spin 0")["rc"] == "0"  # a thread launching in a loop, the gate open
    hp = Probe(node, HP_VGPU)
    assert hp.ask("init")["rc"] == "0"
    started = int(hp.ask("launch kernel 3000000 1")["start"])  # 3 s of high priority in flight
    lp.close()  # returns from main while the loop's launches meet the closed gate
    assert int(hp.ask("now")["t"]) < started + 3 * SECOND  # it left while the gate was closed
    # Detached if the loop was between launches when the exit began (its next launch is then
    # refused), else dead once the exit stopped waiting for the launch held at the gate.
    assert len(ends_of(node, LP_VGPU)) == 1
    assert node.stats(LP_VGPU)["contexts"] == 0
    hp.process.kill()
    hp.process.wait(timeout=10)


def test_forked_child_exit_leaves_the_parent_attached(node: NodeOwner) -> None:
    lp = Probe(node, LP_VGPU)
    assert lp.ask("init")["rc"] == "0"
    assert lp.ask("fork") == {"cmd": "fork", "rc": "0", "status": "0"}
    assert node.events(QS_EV_DETACH) == []
    assert lp.ask("launch kernel 100 5")["rc"] == "0"
    lp.close()
    detached = node.wait_events(QS_EV_DETACH, 1)
    assert [int(e["pid"]) for e in detached] == [lp.process.pid]
    assert node.events(QS_EV_CLIENT_DIED) == []


def test_low_priority_work_still_queued_at_exit_is_charged_at_its_estimate(
    node: NodeOwner,
) -> None:
    """A low-priority process measures kernels of 5 ms (10 of them, 50 ms charged), queues 20
    more under a 1 s window and exits at once, 100 ms of them still queued. The detach
    reclaims them, and their device time is charged at the stream's estimate of 5 ms each:
    about 150 ms in all. Before, no completion thread saw them end, and their time was never
    charged to the policies (50 ms in all)."""
    assert node.command("window 0 1000000")["rc"] == "0"
    lp = Probe(node, LP_VGPU)
    for command in ("init", "launch kernel 5000 10", "sync"):
        assert lp.ask(command)["rc"] == "0"
    assert node.device_ns_once(LP_VGPU, 50 * MS) >= 50 * MS
    assert lp.ask("launch kernel 5000 20")["rc"] == "0"
    lp.close()  # returns from main with the 20 kernels queued
    assert len(node.wait_events(QS_EV_DETACH, 1)) == 1
    assert 130 * MS <= node.stats(LP_VGPU)["device_ns"] <= 200 * MS
