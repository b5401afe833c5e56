"""The card model of `qshare bench model`: contexts time-sliced on one card."""

from __future__ import annotations

import pytest

from qshare.bench.card_model import Card, CardTiming, Item

MS = 1_000_000
US = 1_000


def card(timeslice_ns: int = 2 * MS, switch_ns: int = 0) -> Card:
    return Card(CardTiming(timeslice_ns, switch_ns))


def kernel(ends: dict[str, int], name: str, ns: int) -> Item:
    return Item(ns, lambda t: ends.__setitem__(name, t))


def test_a_lone_context_runs_its_kernels_back_to_back() -> None:
    c, ends = card(), {}
    for i in range(3):
        c.submit("lp", kernel(ends, f"k{i}", 100 * US))
    c.advance(MS)
    assert ends == {"k0": 100 * US, "k1": 200 * US, "k2": 300 * US}


def hp_beside_a_long_lp_kernel(hp_at_ns: int) -> dict[str, int]:
    """A 10 ms LP kernel from 0, a 1 ms HP kernel at `hp_at_ns`, 2 ms timeslices: when each ends."""
    c, ends = card(timeslice_ns=2 * MS), {}
    c.submit("lp", kernel(ends, "long", 10 * MS))
    c.advance(hp_at_ns)
    c.submit("hp", kernel(ends, "hp", MS))
    c.advance(20 * MS)
    return ends


def test_a_waiting_context_gets_the_card_when_the_running_ones_timeslice_ends() -> None:
    assert hp_beside_a_long_lp_kernel(MS // 2)["hp"] == 3 * MS


def test_a_preempted_kernel_resumes_with_its_remaining_time() -> None:
    assert hp_beside_a_long_lp_kernel(MS // 2)["long"] == 11 * MS


def test_the_slice_another_context_meets_is_the_one_under_way() -> None:
    assert hp_beside_a_long_lp_kernel(4 * MS + MS // 2)["hp"] == 7 * MS


def test_a_context_that_runs_dry_hands_the_card_over_at_once() -> None:
    c, ends = card(timeslice_ns=2 * MS), {}
    c.submit("lp", kernel(ends, "lp", 300 * US))
    c.advance(100 * US)
    c.submit("hp", kernel(ends, "hp", 200 * US))
    c.advance(MS)
    assert ends["hp"] == 500 * US


def test_each_switch_between_contexts_costs_the_switch_time() -> None:
    c, ends = card(switch_ns=25 * US), {}
    c.submit("lp", kernel(ends, "lp", 300 * US))
    c.submit("hp", kernel(ends, "hp", 200 * US))
    c.advance(MS)
    assert (ends["lp"], ends["hp"]) == (325 * US, 550 * US)


def test_a_context_keeps_the_card_past_its_timeslice_while_nobody_else_waits() -> None:
    c, ends = card(timeslice_ns=MS), {}
    c.submit("lp", kernel(ends, "lp", 5 * MS))
    c.advance(10 * MS)
    assert ends["lp"] == 5 * MS and c.switches == 1


def test_a_wait_holds_its_context_off_the_card_until_its_word_reads_true() -> None:
    c, ends, word = card(), {}, {"open": False}
    c.submit("lp", kernel(ends, "before", 100 * US))
    c.submit("lp", Item(0, wait=lambda: word["open"]))
    c.submit("lp", kernel(ends, "after", 100 * US))
    c.advance(MS)
    assert "after" not in ends and c.current is None
    word["open"] = True
    c.poke()
    c.advance(2 * MS)
    assert ends["after"] == MS + 100 * US


def test_a_context_held_by_a_wait_lets_another_run_at_once() -> None:
    c, ends = card(), {}
    c.submit("lp", Item(0, wait=lambda: False))
    c.submit("lp", kernel(ends, "lp", 100 * US))
    c.submit("hp", kernel(ends, "hp", 100 * US))
    c.advance(MS)
    assert ends == {"hp": 100 * US}


def test_the_card_counts_each_contexts_device_time() -> None:
    c = card(timeslice_ns=MS)
    c.submit("lp", Item(3 * MS))
    c.submit("hp", Item(MS))
    c.advance(10 * MS)
    assert (c.context("lp").busy_ns, c.context("hp").busy_ns) == (3 * MS, MS)


@pytest.mark.parametrize(("timeslice", "switch"), [(0, 0), (-1, 0), (MS, -1)])
def test_timings_that_cannot_be_are_refused_by_name(timeslice: int, switch: int) -> None:
    with pytest.raises(ValueError, match=r"timeslice_ns|switch_ns"):
        CardTiming(timeslice, switch)


def test_an_item_of_negative_device_time_is_refused() -> None:
    with pytest.raises(ValueError, match="device time"):
        card().submit("lp", Item(-1))
