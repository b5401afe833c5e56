"""`auto` release in the card model: HP's gaps counted as the driver counts them, and the
delay chosen by the driver's own rule every period, in simulated time."""

from __future__ import annotations

from dataclasses import dataclass

from qshare.bench import gpu, model
from qshare.bench.card_model import Card, CardTiming, Item
from qshare.bench.model_auto import AutoRelease, AutoSettings
from qshare.bench.model_hosts import Gate, Loop

MS = 1_000_000
US = 1_000
SETTINGS = AutoSettings(bound_ns=2 * MS, max_delay_ns=100 * MS, held_ns=500 * US)
COSTS = model.HostCosts()
BY = {sc.name: sc for sc in model.SCENARIOS}


def loop() -> Loop:
    return Loop(Card(CardTiming(2 * MS, 0)))


def hp_kernel(lp: Loop, gate: Gate, ns: int) -> None:
    gate.hp_launched()
    lp.card.submit("hp", Item(ns, lambda _t: gate.hp_completed()))


def requests_every(lp: Loop, gate: Gate, every_ns: int, until_ns: int) -> None:
    for t in range(0, until_ns, every_ns):
        lp.at(t, lambda: hp_kernel(lp, gate, MS))


def test_a_gap_is_counted_once_from_hps_last_completion_seen_to_its_next_launch() -> None:
    lp = loop()
    auto = AutoRelease(lp, SETTINGS, lambda: (0, 0))
    auto.start()
    lp.at(1 * MS, lambda: auto.hp_seen(1 * MS))
    for t in (3 * MS, 4 * MS):  # the second launch sees no completion since the first
        lp.at(t, auto.hp_launched)
    lp.run(21 * MS)
    assert auto.gaps_seen == 1.0


def auto_under_requests(every_ns: int, until_ns: int) -> AutoRelease:
    """`auto` on a gate whose HP sends a 1 ms request every `every_ns`, LP's kernels 50 µs."""
    lp = loop()
    gate = Gate(lp, delay_ns=0, seen_ns=100 * US)
    gate.auto = auto = AutoRelease(lp, SETTINGS, lambda: (50 * US * 1000, 1000))
    auto.start()
    requests_every(lp, gate, every_ns, until_ns)
    lp.run(until_ns)
    return auto


def test_the_maximum_delay_holds_until_enough_gaps_are_seen() -> None:
    assert auto_under_requests(30 * MS, 600 * MS).delay_ns == 100 * MS


def test_steady_requests_get_a_short_delay_after_enough_gaps() -> None:
    assert auto_under_requests(30 * MS, 3000 * MS).delay_ns < MS


@dataclass
class FixedChoice:
    delay_ns: int

    def hp_launched(self) -> None:
        pass

    def hp_seen(self, t: int) -> None:
        pass


def test_the_gate_opens_after_the_delay_auto_has_chosen() -> None:
    lp = loop()
    gate = Gate(lp, delay_ns=100 * MS, auto=FixedChoice(300 * US))
    lp.at(0, lambda: hp_kernel(lp, gate, 100 * US))
    lp.run(399 * US)
    assert not gate.is_open
    lp.run(401 * US)
    assert gate.is_open


def test_auto_on_the_eager_hp_harvests_what_the_fixed_delay_leaves_at_no_cost_to_hps_p99() -> None:
    rows = {n: model.simulate(BY[n], CardTiming(), 3.0, 7, COSTS)
            for n in ("eager+lp_qshare_100ms", "eager+lp_qshare_auto")}  # fmt: skip
    fixed, auto = rows["eager+lp_qshare_100ms"], rows["eager+lp_qshare_auto"]
    assert auto["lp_launches_per_s"] > 5 * fixed["lp_launches_per_s"]
    assert auto["hp_p99_ms"] <= fixed["hp_p99_ms"] + 0.1
    assert auto["release_delay_ms"] < 1.0


def test_auto_beside_the_graph_hp_stays_off_the_maximum_once_warmed_up() -> None:
    # 20 requests/s of one launch each (a CUDA graph): the decayed history settles near 40
    # gaps, under the warm-up's 50, which must count the gaps seen instead
    delays = auto_under_requests(50 * MS, 10_000 * MS).delays_ns
    assert max(delays[len(delays) // 2 :]) < MS


def test_auto_beside_the_graph_hp_is_a_row_the_card_has_yet_to_run() -> None:
    sc = BY["graph+lp_qshare_auto"]
    assert (sc.hp, sc.lp, sc.mode) == ("graph", "resnet50", "qshare-auto")
    assert sc.name not in model.MEASURED and sc.name in gpu.SETS["auto"]


def test_the_auto_targets_compare_auto_with_the_fixed_delay_on_the_eager_hp() -> None:
    rows = {"eager+lp_qshare_auto": {"hp_p99_ms": 20.0, "lp_launches_per_s": 900.0},
            "eager+lp_qshare_100ms": {"hp_p99_ms": 19.0, "lp_launches_per_s": 100.0}}  # fmt: skip
    met = model.predicted_targets(rows, {})
    assert (met["eager_auto_hp_p99_met"], met["eager_auto_lp_above_met"]) == (False, True)
