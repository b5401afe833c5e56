"""`qshare bench gpu`'s arithmetic on recorded runs (the runs themselves need a GPU): choosing
scenarios, merging runs from several leases, and the ratios against each workload alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qshare.bench import gpu


def test_only_picks_the_named_scenarios_in_the_order_given() -> None:
    chosen = gpu.chosen_scenarios("graph_alone,lp_alone,graph+lp_qshare_1ms_w200")
    assert [sc.name for sc in chosen] == ["graph_alone", "lp_alone", "graph+lp_qshare_1ms_w200"]
    assert chosen[2].window_us == 200


def test_only_refuses_an_unknown_scenario_by_name() -> None:
    with pytest.raises(SystemExit, match="no_such_scenario"):
        gpu.chosen_scenarios("graph_alone,no_such_scenario")


def test_merge_joins_the_runs_of_each_scenario_across_results() -> None:
    first = {"gpu": "H100", "raw": {"lp_alone": [{"lp_items_per_s": 1.0}]}}
    second = {"gpu": "H100", "raw": {"lp_alone": [{"lp_items_per_s": 3.0}], "gpt2_alone": [{}]}}
    merged = gpu.merge_raw([first, second])
    assert merged["lp_alone"] == [{"lp_items_per_s": 1.0}, {"lp_items_per_s": 3.0}]
    assert gpu.summarize(merged["lp_alone"])["lp_items_per_s"] == 2.0


def test_merge_refuses_results_from_different_gpus() -> None:
    with pytest.raises(SystemExit, match="different GPUs"):
        gpu.merge_raw([{"gpu": "H100", "raw": {}}, {"gpu": "H200", "raw": {}}])


def test_ratios_are_taken_against_the_same_workloads_alone() -> None:
    scenarios = {
        "graph_alone": {"hp_p99_ms": 2.0, "hp_busy_share": 0.2},
        "lp_alone": {"lp_items_per_s": 1000.0},
        "graph+lp_qshare_1ms": {"hp_p99_ms": 2.5, "lp_items_per_s": 600.0},
    }
    gpu.add_derived(scenarios)
    row = scenarios["graph+lp_qshare_1ms"]
    assert row["hp_p99_ratio"] == pytest.approx(1.25)
    assert row["hp_p99_added_ms"] == pytest.approx(0.5)
    assert row["lp_ratio"] == pytest.approx(0.6)
    assert row["harvest"] == pytest.approx(0.6 / 0.8)


def test_two_stream_training_is_compared_with_itself_alone_not_with_one_stream() -> None:
    scenarios = {
        "lp_alone": {"lp_items_per_s": 3000.0},
        "resnet50_2s_alone": {"lp_items_per_s": 1000.0},
        "lp2s_alone_qshare": {"lp_items_per_s": 900.0},
    }
    gpu.add_derived(scenarios)
    assert scenarios["lp2s_alone_qshare"]["lp_ratio"] == pytest.approx(0.9)


def test_a_summary_keeps_the_interposer_statistics_of_the_first_run_that_has_them() -> None:
    runs = [
        {"lp_items_per_s": 1.0},
        {"lp_items_per_s": 3.0, "lp_interposer": {"launches": {"batched": 7}}},
        {"lp_items_per_s": 2.0, "lp_interposer": {"launches": {"batched": 9}}},
    ]
    summary = gpu.summarize(runs)
    assert summary["lp_items_per_s"] == 2.0
    assert summary["lp_interposer"] == {"launches": {"batched": 7}}


def test_a_statistics_scenario_has_its_workers_write_the_interposer_statistics(
    tmp_path: Path,
) -> None:
    (sc,) = gpu.chosen_scenarios("lp_alone_qshare_stats")
    env = gpu.worker_env(sc, "lp", 2, "seg", tmp_path / "lp-1.json")
    assert env["QSHARE_STATS_FILE"] == str(tmp_path / "lp-1.stats.json")
    assert env["QSHARE_VGPU"] == "2"


def test_other_scenarios_keep_their_workers_free_of_statistics(tmp_path: Path) -> None:
    (sc,) = gpu.chosen_scenarios("lp_alone_qshare")
    assert "QSHARE_STATS_FILE" not in gpu.worker_env(sc, "lp", 2, "seg", tmp_path / "lp.json")


def test_a_device_gate_scenario_turns_the_gate_on_for_its_low_priority_worker_only(
    tmp_path: Path,
) -> None:
    (sc,) = gpu.chosen_scenarios("graph+lp_qshare_1ms_devgate")
    assert gpu.worker_env(sc, "lp", 2, "seg", tmp_path / "lp.json")["QSHARE_LP_DEVICE_GATE"] == "1"
    assert "QSHARE_LP_DEVICE_GATE" not in gpu.worker_env(sc, "hp", 1, "seg", tmp_path / "hp.json")


@pytest.mark.parametrize("name", sorted(gpu.SETS))
def test_a_named_set_picks_known_scenarios(name: str) -> None:
    assert [sc.name for sc in gpu.chosen_scenarios(f"@{name}")] == list(gpu.SETS[name])


def test_an_unknown_set_is_refused_by_name() -> None:
    with pytest.raises(SystemExit, match="@nope"):
        gpu.chosen_scenarios("@nope")


def _one_run_result(p99_ms: float, alone_ms: float) -> dict[str, object]:
    row = {"runs": 1, "hp_p99_ms": p99_ms, "hp_p99_ms_spread": [p99_ms, p99_ms]}
    row["hp_p99_ratio"] = p99_ms / alone_ms
    return {"gpu": "H100", "rounds": 1, "scenarios": {"graph+lp_qshare_1ms": row}}


def test_plot_draws_a_single_run_whose_ratio_rounds_below_its_spread(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    # 38.425 * ((38.425 / 13.4984) / 38.425) is one ulp above 38.425 / 13.4984
    result = gpu.plotted(_one_run_result(38.425, 13.4984), tmp_path)
    assert "plot_error" not in result
    assert result["plot"] == str(tmp_path / "gpu.png")


def test_a_plot_that_fails_keeps_the_figures_and_names_the_fault(tmp_path: Path) -> None:
    result = _one_run_result(2.0, 1.0)
    del result["gpu"]  # the plot's title needs it
    out = gpu.plotted(result, tmp_path)
    assert out["plot"] is None
    assert "KeyError" in out["plot_error"]
    assert out["scenarios"]["graph+lp_qshare_1ms"]["hp_p99_ms"] == 2.0


def test_bench_gpu_needs_no_driver_binding_on_the_gpu_machine() -> None:
    # the GPU machine has PyTorch and the native build, not cffi or qshare_driver
    code = "import sys; sys.modules['qshare_driver'] = None; import qshare.bench.gpu"
    env = {**os.environ, "PYTHONPATH": str(Path(gpu.__file__).parents[2])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_every_named_set_names_known_scenarios() -> None:
    for name in gpu.SETS:
        assert gpu.chosen_scenarios(f"@{name}")


def test_runs_written_part_way_merge_like_a_finished_result(tmp_path: Path) -> None:
    runs: dict[str, list[dict[str, object]]] = {
        "graph_alone": [{"hp_p99_ms": 2.0}],
        "graph+lp_qshare_1ms": [],
    }
    gpu.write_partial(tmp_path / "gpu-partial.json", "H100", 10.0, runs)
    partial = json.loads((tmp_path / "gpu-partial.json").read_text())
    merged = gpu.merge_raw([partial, {"gpu": "H100", "raw": {"graph_alone": [{"hp_p99_ms": 4.0}]}}])
    assert merged == {"graph_alone": [{"hp_p99_ms": 2.0}, {"hp_p99_ms": 4.0}]}
