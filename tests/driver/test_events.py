"""Events reach the owner in order, with timestamps, and a full ring counts its drops."""

from __future__ import annotations

import itertools

import pytest

from qshare_driver import Client, EventKind, Node, OutOfMemoryError

GiB = 1 << 30


def test_events_arrive_in_the_order_things_happened(node: Node) -> None:
    node.create_vgpu(1, 0, "high", 50, GiB)
    node.set_release_delay(0, 0)
    with Client.attach(node.name, 1, node.directory) as c:
        c.launch_begin()
        c.launch_end()
        node.suspend(1)
        node.resume(1)
    events = list(node.events(0.3))
    kinds = [e.kind for e in events]
    order = [EventKind.ATTACH, EventKind.BUSY, EventKind.SUSPENDED, EventKind.RESUMED]
    assert [k for k in kinds if k in order] == order
    assert EventKind.DETACH in kinds
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    assert all(a.time_ns <= b.time_ns for a, b in itertools.pairwise(events))


def test_full_ring_drops_the_oldest_and_counts_them(node: Node) -> None:
    node.create_vgpu(1, 0, "low", 50, GiB)
    with Client.attach(node.name, 1, node.directory) as c:
        for _ in range(5000):
            with pytest.raises(OutOfMemoryError):
                c.reserve(2 * GiB)
    events = list(node.events(0.1))
    assert node.dropped_events > 0
    assert len(events) + node.dropped_events >= 5001
    assert events[-1].kind == EventKind.DETACH


def test_next_event_times_out_with_none(node: Node) -> None:
    assert node.next_event(0.01) is None
