"""`qshare bench gpu`'s `_mps_sm80` rows: under MPS, the LP worker is kept off a fifth of the
card's SMs (its active thread percentage) and runs at client priority 1; HP is not limited."""

from __future__ import annotations

from pathlib import Path

from qshare.bench import gpu


def test_the_lp_worker_of_an_mps_sm_row_may_use_80_percent_of_the_sms(tmp_path: Path) -> None:
    sc = gpu.scenario("graph+gpt2_qshare_1ms_mps_sm80")
    env = gpu.worker_env(sc, "lp", gpu.LP_VGPU, "seg", tmp_path / "lp.json")
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "80"
    assert env["CUDA_MPS_CLIENT_PRIORITY"] == "1"


def test_the_hp_worker_of_an_mps_sm_row_is_not_limited(tmp_path: Path) -> None:
    sc = gpu.scenario("graph+gpt2_qshare_1ms_mps_sm80")
    env = gpu.worker_env(sc, "hp", gpu.HP_VGPU, "seg", tmp_path / "hp.json")
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env


def test_each_mps_sm_row_is_its_row_under_mps_with_only_the_sm_limit_added() -> None:
    for name, hp, lp, mode in gpu.MPS_SM_ROWS:
        sc = gpu.scenario(f"{name}_mps_sm80")
        assert (sc.hp, sc.lp, sc.mode, sc.mps, sc.lp_sm_percent) == (hp, lp, mode, True, 80)


def test_the_mps_sm_set_runs_each_limited_row_beside_its_baselines() -> None:
    names = {sc.name for sc in gpu.chosen_scenarios("@mpssm")}
    assert {"graph_alone", "lp_alone", "gpt2_alone", "lp_alone_mps"} <= names
    assert {f"{row[0]}_mps_sm80" for row in gpu.MPS_SM_ROWS} <= names
