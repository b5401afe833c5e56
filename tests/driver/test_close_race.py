"""Closing the node owner's handle while other threads use it (an agent stopping while its
device plugin or event reader still runs): calls in progress finish first, later calls are
refused with an error naming the closed segment, and nothing touches the unmapped segment."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from qshare_driver import DriverError, Node

GiB = 1 << 30


def _reader(node: Node, failures: list[BaseException], started: threading.Event) -> None:
    try:
        while True:
            node.card_stats(0)
            node.list_vgpus()
            started.set()
    except BaseException as exc:  # the thread's outcome, for the test to check
        failures.append(exc)


def test_calls_racing_a_close_from_other_threads_are_refused_not_crashed(shm_dir: str) -> None:
    node = Node.create(f"t{uuid.uuid4().hex[:8]}", shm_dir)
    node.add_card(0, "GPU-sim-0", 16 * GiB)
    failures: list[BaseException] = []
    started = [threading.Event() for _ in range(4)]
    readers = [
        threading.Thread(target=_reader, args=(node, failures, s), daemon=True) for s in started
    ]
    for thread in readers:
        thread.start()
    assert all(s.wait(5) for s in started)
    node.close()
    for thread in readers:
        thread.join(5)
    assert len(failures) == 4
    assert all(isinstance(f, DriverError) and "is closed" in str(f) for f in failures)


def test_a_wait_for_events_without_timeout_ends_when_another_thread_closes(
    shm_dir: str,
) -> None:
    node = Node.create(f"t{uuid.uuid4().hex[:8]}", shm_dir)
    outcome: list[BaseException | object] = []

    def wait_forever() -> None:
        try:
            outcome.append(node.next_event(None))
        except DriverError as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait_forever, daemon=True)
    waiter.start()
    time.sleep(0.05)
    node.close()
    waiter.join(5)  # one slice of the wait, not forever
    assert not waiter.is_alive()
    assert isinstance(outcome[0], DriverError) and "is closed" in str(outcome[0])


def test_a_closed_node_refuses_calls_naming_the_segment(node: Node) -> None:
    node.close()
    with pytest.raises(DriverError, match=f"node segment '{node.name}' is closed"):
        node.card_stats(0)


def test_closing_twice_is_harmless(node: Node) -> None:
    node.close()
    node.close()
    with pytest.raises(DriverError, match="is closed"):
        node.list_cards()


def test_a_timed_wait_for_events_still_returns_none_when_nothing_comes(node: Node) -> None:
    started = time.monotonic()
    assert node.next_event(0.45) is None
    assert time.monotonic() - started >= 0.45
