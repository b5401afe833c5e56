"""Detaching a workload's client while other threads of the process use it (a benchmark or
demo stopping its workload): calls in progress finish first, later calls are refused with
an error naming the detached vGPU, and nothing runs on the freed handle."""

from __future__ import annotations

import threading
import time

from qshare_driver import Client, DriverError, Node

GiB = 1 << 30


def _attached(node: Node, vgpu: int, priority: str) -> Client:
    node.create_vgpu(vgpu, 0, priority, 50, GiB)
    return Client.attach(node.name, vgpu, node.directory)


def _reader(client: Client, failures: list[BaseException], started: threading.Event) -> None:
    try:
        while True:
            client.info()
            client.account_device_time(0.000001)
            started.set()
    except BaseException as exc:  # the thread's outcome, for the test to check
        failures.append(exc)


def test_calls_racing_a_detach_from_other_threads_are_refused_not_crashed(node: Node) -> None:
    client = _attached(node, 2, "low")
    failures: list[BaseException] = []
    started = [threading.Event() for _ in range(4)]
    for s in started:
        threading.Thread(target=_reader, args=(client, failures, s), daemon=True).start()
    assert all(s.wait(5) for s in started)
    client.detach()
    deadline = time.monotonic() + 5
    while len(failures) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(failures) == 4
    assert all(isinstance(f, DriverError) and "vGPU 2 is detached" in str(f) for f in failures)


def test_a_detach_waits_for_a_launch_held_at_the_gate_on_another_thread(node: Node) -> None:
    node.set_release_delay(0, 0.0)
    hp, lp = _attached(node, 1, "high"), _attached(node, 2, "low")
    outcome: list[str] = []

    def launch() -> None:
        lp.launch_begin()
        outcome.append("through the gate")
        try:
            lp.launch_end()
        except DriverError as exc:
            outcome.append(str(exc))

    hp.launch_begin()
    launcher = threading.Thread(target=launch, daemon=True)
    launcher.start()
    time.sleep(0.05)
    detacher = threading.Thread(target=lp.detach, daemon=True)
    detacher.start()
    detacher.join(0.2)
    assert detacher.is_alive(), "detached while a launch was held at the gate"
    hp.launch_end()
    detacher.join(5)
    launcher.join(5)
    assert not detacher.is_alive() and not launcher.is_alive()
    assert outcome == ["through the gate", "client of vGPU 2 is detached"]
    hp.detach()
