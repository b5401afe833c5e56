"""How a process under the interposer leaves its vGPU: a normal exit detaches (the owner
records `detach`), a kill is a death (`client_died`, reaped by the owner), and neither a
thread still launching nor a forked child turns one into the other or hangs the exit."""

from __future__ import annotations

import signal

from .conftest import HP_VGPU, LP_VGPU, NodeOwner, Probe, run_probe

QS_EV_DETACH = 7
QS_EV_CLIENT_DIED = 8
SECOND = 1_000_000_000


def events_of(node: NodeOwner, kind: int, vgpu: int) -> list[dict[str, str]]:
    return [e for e in node.events(kind) if int(e["vgpu"]) == vgpu]


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


def test_exit_while_a_thread_is_held_at_the_gate_does_not_wait_for_the_gate(
    node: NodeOwner,
) -> None:
    hp = Probe(node, HP_VGPU)
    assert hp.ask("init")["rc"] == "0"
    started = int(hp.ask("launch kernel 3000000 1")["start"])  # 3 s of high priority in flight
    run = run_probe(node, LP_VGPU, ["init", "spin 0"])  # its launches wait at the closed gate
    assert int(hp.ask("now")["t"]) < started + 3 * SECOND  # LP left while the gate was closed
    assert run.returncode == 0, run.stderr
    assert "records this exit as the process's death" in run.stderr
    assert len(node.wait_events(QS_EV_CLIENT_DIED, 1)) == 1
    assert events_of(node, QS_EV_DETACH, LP_VGPU) == []
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
