"""The hosts of `qshare bench model`: qshare's gate, the low-priority launcher under the
window (and the device gate), and the high-priority request server."""

from __future__ import annotations

import pytest

from qshare.bench.card_model import Card, CardTiming, Item
from qshare.bench.model_hosts import (
    BatchFences,
    Gate,
    HighPriority,
    Loop,
    LowPriority,
    LpSettings,
)

MS = 1_000_000
US = 1_000


def loop(timeslice_ns: int = 2 * MS) -> Loop:
    return Loop(Card(CardTiming(timeslice_ns, 0)))


def hp_kernel(lp: Loop, gate: Gate, ns: int) -> None:
    gate.hp_launched()
    lp.card.submit("hp", Item(ns, lambda _t: gate.hp_completed()))


def sampled(lp: Loop, every_ns: int, until_ns: int, read: object) -> list[object]:
    seen: list[object] = []
    for t in range(0, until_ns, every_ns):
        lp.at(t, lambda: seen.append(read()))  # type: ignore[operator]
    return seen


def test_an_hp_launch_closes_the_gate_until_hp_has_been_idle_the_release_delay() -> None:
    lp = loop()
    gate = Gate(lp, delay_ns=MS)
    lp.at(0, lambda: hp_kernel(lp, gate, 200 * US))
    lp.run(1100 * US)
    assert not gate.is_open
    lp.run(1300 * US)
    assert gate.is_open and gate.closed_ns == 1200 * US


def test_an_hp_launch_during_the_release_delay_calls_the_release_off() -> None:
    lp = loop()
    gate = Gate(lp, delay_ns=MS)
    lp.at(0, lambda: hp_kernel(lp, gate, 100 * US))
    lp.at(900 * US, lambda: hp_kernel(lp, gate, 100 * US))
    lp.run(1500 * US)
    assert not gate.is_open
    lp.run(2100 * US)
    assert gate.is_open


def test_a_gate_without_qshare_never_closes() -> None:
    lp = loop()
    gate = Gate(lp, delay_ns=MS, enabled=False)
    lp.at(0, lambda: hp_kernel(lp, gate, 100 * US))
    lp.run(50 * US)
    assert gate.is_open


def test_gated_lp_submits_nothing_while_the_gate_is_closed() -> None:
    lp = loop()
    gate = Gate(lp, delay_ns=MS)
    low = LowPriority(lp, gate, [(10 * US, 10 * US)], LpSettings(500 * US, gated=True, wake_ns=0))
    low.start()
    lp.at(5 * MS, lambda: hp_kernel(lp, gate, 100 * US))
    lp.run(5 * MS)
    before = low.completed
    lp.run(6 * MS)  # closed from 5 ms to 6.1 ms; what LP had queued drains at once
    assert low.completed - before <= 1
    lp.run(8 * MS)
    assert low.completed - before > 100


def test_the_window_bounds_lp_queued_device_time_to_the_window_and_one_launch() -> None:
    lp = loop()
    low = LowPriority(lp, Gate(lp, 0), [(US, 100 * US)], LpSettings(500 * US, gated=True))
    low.start()
    queued = sampled(lp, 37 * US, 20 * MS, lambda: lp.card.context("lp").queued_ns)
    lp.run(20 * MS)
    assert max(queued) <= 600 * US  # type: ignore[type-var]


def test_plain_lp_queues_as_deep_as_the_drivers_push_buffer() -> None:
    lp = loop()
    low = LowPriority(lp, Gate(lp, 0, enabled=False), [(US, 100 * US)], LpSettings(depth=50))
    low.start()
    depth = sampled(lp, 7 * US, 10 * MS, lambda: len(lp.card.context("lp").queue))
    lp.run(10 * MS)
    assert max(depth) == 50  # type: ignore[type-var]


def test_the_device_gate_holds_lp_queued_work_on_the_card_while_the_gate_is_closed() -> None:
    lp = loop()
    gate = Gate(lp, delay_ns=10 * MS)
    s = LpSettings(20 * MS, gated=True, device_gate_slice_ns=100 * US)
    low = LowPriority(lp, gate, [(US, 20 * US)], s)
    low.start()
    lp.run(5 * MS)
    lp.at(5 * MS, lambda: hp_kernel(lp, gate, 100 * US))
    lp.run(5 * MS + 200 * US)
    done = low.completed
    lp.run(14 * MS)
    assert low.completed - done <= 5  # the slice under way, not the 20 ms queued
    assert lp.card.context("lp").queued_ns > 10 * MS


def test_hp_waits_only_for_lps_slice_under_the_device_gate() -> None:
    lp = loop()
    gate = Gate(lp, delay_ns=10 * MS)
    low = LowPriority(lp, gate, [(US, 20 * US)],
                      LpSettings(20 * MS, gated=True, device_gate_slice_ns=100 * US))  # fmt: skip
    hp = HighPriority(lp, gate, [(0, 500 * US)], 50.0, seed=1, until_ns=200 * MS)
    low.start()
    hp.start()
    lp.run(250 * MS)
    assert max(hp.latencies_ns) <= 500 * US + 100 * US + 20 * US


def test_an_hp_requests_latency_runs_from_its_arrival_to_its_last_kernel() -> None:
    lp = loop()
    hp = HighPriority(lp, Gate(lp, MS), [(0, 300 * US), (100 * US, 200 * US)], 1.0, 3, 10**10)
    hp.start()
    lp.run(10**10 + 10 * MS)
    assert hp.latencies_ns and set(hp.latencies_ns) == {500 * US}


def test_hp_requests_arrive_the_same_way_for_the_same_seed() -> None:
    runs = []
    for _ in range(2):
        lp = loop()
        hp = HighPriority(lp, Gate(lp, MS), [(0, 100 * US)], 30.0, seed=5, until_ns=MS * 1000)
        hp.start()
        lp.run(MS * 1000 + MS)
        runs.append(hp.latencies_ns)
    assert runs[0] == runs[1] and len(runs[0]) > 10


def test_empty_timelines_and_a_rate_of_zero_are_refused_by_name() -> None:
    lp = loop()
    with pytest.raises(ValueError, match="low-priority timeline"):
        LowPriority(lp, Gate(lp, 0), [], LpSettings())
    with pytest.raises(ValueError, match="high-priority request"):
        HighPriority(lp, Gate(lp, 0), [], 30.0, 1, MS)
    with pytest.raises(ValueError, match="rate"):
        HighPriority(lp, Gate(lp, 0), [(0, 1)], 0.0, 1, MS)


def fenced(close_ns: int) -> tuple[Loop, BatchFences, list[tuple[int, int]]]:
    """Fences closing at `close_ns`, 10 µs to see one; what was seen, and when."""
    lp = loop()
    seen: list[tuple[int, int]] = []
    return lp, BatchFences(lp, close_ns, 10 * US, lambda ns: seen.append((lp.now, ns))), seen


def test_lp_completions_are_seen_a_whole_batch_at_a_time() -> None:
    lp, fences, seen = fenced(100 * US)
    for _ in range(4):
        batch = fences.add(25 * US)
        lp.card.submit("lp", Item(25 * US, lambda _t, b=batch: fences.launch_ended(b)))
    lp.run(MS)
    assert seen == [(110 * US, 100 * US)]


def test_a_launcher_that_stops_records_the_fence_of_its_open_batch() -> None:
    lp, fences, seen = fenced(100 * US)
    batch = fences.add(25 * US)
    lp.card.submit("lp", Item(25 * US, lambda _t: fences.launch_ended(batch)))
    lp.run(MS)
    assert seen == []
    fences.close()
    lp.run(2 * MS)
    assert seen == [(MS + 10 * US, 25 * US)]
