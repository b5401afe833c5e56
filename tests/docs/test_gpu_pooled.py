"""`qshare bench gpu` pools each scenario's HP requests over its runs and judges a p99 target
on a bootstrap interval: met or missed only where the requests can decide, else undecided.
Synthetic latencies here (no GPU); the arithmetic is what is specified."""

from __future__ import annotations

import random
from typing import Any

import pytest

from qshare.bench import gpu, gpu_pooled
from qshare.bench.stats import percentile


def latencies(n: int, scale: float = 1.0, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return [scale * rng.lognormvariate(0.0, 0.3) for _ in range(n)]


def run(xs: list[float], **more: Any) -> dict[str, Any]:
    return {gpu_pooled.LATENCIES: xs, "hp_p99_ms": percentile(xs, 99), **more}


def test_the_pool_is_every_request_of_the_runs_that_kept_them() -> None:
    runs = [run([1.0, 2.0]), {"hp_p99_ms": 9.0}, run([3.0])]
    assert gpu_pooled.samples(runs) == [1.0, 2.0, 3.0]


def test_the_pooled_p99_is_the_p99_of_all_requests_not_a_median_of_runs() -> None:
    a, b, c = latencies(300, seed=1), latencies(300, seed=2), latencies(300, 3.0, seed=3)
    found = gpu_pooled.pooled([run(a), run(b), run(c)])
    assert found["hp_samples"] == 900
    assert found["hp_p99_pooled_ms"] == percentile(a + b + c, 99)


def test_the_interval_holds_the_pooled_p99() -> None:
    found = gpu_pooled.pooled([run(latencies(900))])
    low, high = found["hp_p99_pooled_ci90"]
    assert low < found["hp_p99_pooled_ms"] < high


def test_the_interval_is_the_same_each_time_for_the_same_requests() -> None:
    xs = latencies(600)
    assert gpu_pooled.p99_interval(xs) == gpu_pooled.p99_interval(xs)


def test_runs_without_latencies_pool_to_nothing() -> None:
    assert gpu_pooled.pooled([{"hp_p99_ms": 2.0}]) == {}


@pytest.mark.parametrize(
    ("bounds", "said"),
    [((0.9, 1.04), "met"), ((1.06, 1.2), "missed"), ((0.95, 1.1), "undecided"), (None, None)],
)
def test_a_verdict_is_given_only_where_the_whole_interval_is_on_one_side(
    bounds: tuple[float, float] | None, said: str | None
) -> None:
    assert gpu_pooled.verdict(bounds, 1.05) == said


def test_a_run_slower_at_every_request_misses_a_5_percent_bound() -> None:
    alone = [run(latencies(900, seed=4))]
    slower = [run(latencies(900, 1.5, seed=5))]
    assert gpu_pooled.within(slower, alone, 1.05) == "missed"


def test_a_run_faster_at_every_request_meets_a_5_percent_bound() -> None:
    alone = [run(latencies(900, seed=4))]
    faster = [run(latencies(900, 0.7, seed=5))]
    assert gpu_pooled.within(faster, alone, 1.05) == "met"


def test_300_requests_like_alone_cannot_decide_a_5_percent_bound() -> None:
    alone, same = [run(latencies(300, seed=6))], [run(latencies(300, seed=7))]
    assert gpu_pooled.within(same, alone, 1.05) == "undecided"


def test_the_added_p99_interval_is_around_the_difference() -> None:
    xs, base = latencies(900, seed=8), latencies(900, seed=9)
    low, high = gpu_pooled.added_interval([x + 1.0 for x in xs], base)
    assert low < percentile(xs, 99) + 1.0 - percentile(base, 99) < high


def test_the_pooled_targets_judge_the_issue_rows_and_say_none_where_rows_are_missing() -> None:
    raw = {
        "graph_alone": [run(latencies(900, seed=10))],
        "graph+lp_qshare_1ms": [run(latencies(900, 2.0, seed=11))],
        "graph+lp_qshare_100ms": [run(latencies(900, 0.7, seed=12))],
    }
    scenarios = {name: gpu.summarize(runs) for name, runs in raw.items()}
    gpu.add_pooled(scenarios, raw)
    assert gpu_pooled.targets(scenarios, raw, gpt2_kernel_ms=0.12) == {
        "graph_1ms_hp_p99": "missed", "graph_100ms_hp_p99": "met",
        "gpt2_hp_p99": None, "eager_auto_hp_p99": None}  # fmt: skip


def test_an_hp_run_keeps_its_latencies_and_the_summary_leaves_them_out() -> None:
    figures = gpu._figures("hp", {"latency_ms": [1.23456, 2.0], "busy_share": 0.1})
    assert figures[gpu_pooled.LATENCIES] == [1.2346, 2.0]
    assert gpu_pooled.LATENCIES not in gpu.summarize([figures])


def test_a_colocated_row_is_set_beside_hp_alone_on_the_pooled_requests() -> None:
    raw = {"graph_alone": [run(latencies(900, seed=13))],
           "graph+lp_qshare_1ms": [run(latencies(900, 2.0, seed=14))]}  # fmt: skip
    scenarios = {name: gpu.summarize(runs) for name, runs in raw.items()}
    gpu.add_pooled(scenarios, raw)
    row = scenarios["graph+lp_qshare_1ms"]
    assert row["hp_p99_within_5pct"] == "missed"
    assert row["hp_p99_pooled_ratio"] == pytest.approx(
        percentile(gpu_pooled.samples(raw["graph+lp_qshare_1ms"]), 99)
        / percentile(gpu_pooled.samples(raw["graph_alone"]), 99)
    )
    assert "hp_p99_pooled_ratio" not in scenarios["graph_alone"]


def test_runs_from_before_latencies_were_kept_merge_without_pooled_figures() -> None:
    raw = {"graph_alone": [{"hp_p99_ms": 2.0}], "graph+lp_qshare_1ms": [{"hp_p99_ms": 2.5}]}
    scenarios = {name: gpu.summarize(runs) for name, runs in raw.items()}
    gpu.add_pooled(scenarios, raw)
    assert "hp_p99_within_5pct" not in scenarios["graph+lp_qshare_1ms"]
    assert gpu_pooled.targets(scenarios, raw, gpt2_kernel_ms=0.12)["graph_1ms_hp_p99"] is None


def test_the_decide_set_holds_the_graph_hp_alone_and_each_row_it_is_judged_against() -> None:
    names = [sc.name for sc in gpu.chosen_scenarios("@decide")]
    assert names[0] == "graph_alone"
    assert {"graph+lp_qshare_1ms", "graph+lp_qshare_100ms"} <= set(names)
