"""`qshare bench model`: the scenarios of `bench gpu` on the card model, beside the H100's."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from qshare.bench import gpu, model
from qshare.bench.card_model import CardTiming

ROOT = Path(__file__).resolve().parents[2]
COSTS = model.HostCosts()
BY = {sc.name: sc for sc in model.SCENARIOS}


def added_p99(name: str, timing: CardTiming, seconds: float = 2.0) -> float:
    alone = model.simulate(BY[f"{BY[name].hp}_alone"], timing, seconds, 7, COSTS)
    return model.simulate(BY[name], timing, seconds, 7, COSTS)["hp_p99_ms"] - alone["hp_p99_ms"]


def test_the_model_runs_bench_gpus_scenarios_as_bench_gpu_defines_them() -> None:
    for name in model.MEASURED:
        sc, card = BY[name], gpu.scenario(name)
        assert (sc.hp, sc.lp, sc.mode, sc.device_gate, sc.window_us) == (
            card.hp, card.lp, card.mode, card.device_gate, card.window_us)  # fmt: skip


def test_a_shorter_timeslice_is_a_scenario_of_its_own_named_after_it() -> None:
    sc = BY["graph+gpt2_qshare_1ms_devgate_ts250"]
    assert (sc.timeslice_us, sc.device_gate, sc.lp) == (250, True, "gpt2")


def test_without_qshare_hp_waits_longer_behind_a_longer_timeslice() -> None:
    short = added_p99("graph+lp_plain", CardTiming(500_000))
    long = added_p99("graph+lp_plain", CardTiming(3_000_000))
    assert long > short + 1.0


def test_under_qshare_hp_waits_for_the_window_not_for_a_timeslice() -> None:
    timing = CardTiming(3_000_000)
    assert added_p99("graph+lp_qshare_1ms", timing) < added_p99("graph+lp_plain", timing) / 2


def test_the_device_gate_keeps_more_lp_beside_hp_than_the_window() -> None:
    rows = {n: model.simulate(BY[n], CardTiming(), 2.0, 7, COSTS) for n in
            ("lp_alone", "graph+lp_qshare_1ms", "graph+lp_qshare_1ms_devgate")}  # fmt: skip
    lp = {n: r["lp_launches_per_s"] for n, r in rows.items()}
    assert lp["graph+lp_qshare_1ms_devgate"] > lp["graph+lp_qshare_1ms"] * 1.05


def test_each_row_the_h100_measured_is_set_beside_the_models() -> None:
    rows = {n: model.run_scenario(BY[n], CardTiming(), 1.0, 1, COSTS)
            for n in ("graph_alone", "lp_alone", "graph+lp_plain")}  # fmt: skip
    model.add_derived(rows, BY)
    model.compare(rows, model.measured())
    row = rows["graph+lp_plain"]
    assert row["gpu_source"] == "gpu-h100.json"
    assert row["gpu_hp_p99_added_ms"] == pytest.approx(3.22, abs=0.01)
    assert row["error_hp_p99_added_ms"] == row["hp_p99_added_ms"] - row["gpu_hp_p99_added_ms"]


def test_the_h100_p50_added_is_against_hp_alone_in_the_same_file() -> None:
    gpu = model.measured()
    merged = json.loads(model.GPU_FILES[1].read_text())["scenarios"]
    row = merged["graph+lp_qshare_1ms_devgate"]
    expected = row["hp_p50_ms"] - merged["graph_alone"]["hp_p50_ms"]
    assert gpu["graph+lp_qshare_1ms_devgate"]["hp_p50_added_ms"] == pytest.approx(expected)


def test_an_unknown_scenario_is_refused_by_name() -> None:
    args = argparse.Namespace(seconds=0.1, rounds=1, quick=True, only="graph+nothing")
    with pytest.raises(SystemExit, match="graph\\+nothing"):
        model.run(args)


def test_a_quick_run_writes_each_scenario_with_its_alone_rows(tmp_path: Path) -> None:
    out = tmp_path / "model.json"
    cmd = [sys.executable, "-m", "qshare.bench", "model", "--quick", "--seconds", "0.5",
           "--only", "graph+lp_qshare_1ms", "--json", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, timeout=120)
    result = json.loads(out.read_text())
    assert set(result["scenarios"]) == {"graph_alone", "lp_alone", "graph+lp_qshare_1ms"}
    assert result["fit"] is None and "lp_ratio" in result["scenarios"]["graph+lp_qshare_1ms"]


def test_the_targets_are_judged_on_the_models_rows_against_the_h100s_hp_alone() -> None:
    gpu = {"graph_alone": {"hp_p99_ms": 2.0}}  # the bound is 5 % of it: +0.10 ms
    rows = {
        "graph+lp_qshare_1ms": {"hp_p99_added_ms": 0.11, "harvest": 0.95},
        "graph+lp_qshare_1ms_devgate": {"hp_p99_added_ms": 0.09, "harvest": 0.85},
        "graph+gpt2_qshare_1ms_devgate": {"hp_p99_added_ms": 0.11},
    }
    met = model.predicted_targets(rows, gpu)
    assert (met["graph_1ms_hp_p99_met_window"], met["graph_1ms_hp_p99_met_device_gate"]) == (
        False, True)  # fmt: skip
    assert (met["graph_1ms_harvest_met_window"], met["graph_1ms_harvest_met_device_gate"]) == (
        True, False)  # fmt: skip
    assert met["gpt2_hp_p99_met_device_gate"] is True  # the trace's p99 kernel: 0.12 ms
    assert met["graph_100ms_hp_p99_met_window"] is None
