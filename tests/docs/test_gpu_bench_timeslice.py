"""`qshare bench gpu`'s timeslice rows: the card's timeslice is set with nvidia-smi for the
run and put back after it (a fake nvidia-smi here, as no GPU is)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qshare import gpu_timeslice
from qshare.bench import gpu

CARD = gpu.Card("NVIDIA H100", "GPU-1234", 80 * 1024)


def fake_nvidia_smi(tmp: Path, monkeypatch: pytest.MonkeyPatch, exit_code: int = 0) -> Path:
    """A stand-in for the driver's tool: records its arguments, fails as asked."""
    log = tmp / "calls"
    tool = tmp / "bin" / "nvidia-smi"
    tool.parent.mkdir()
    tool.write_text(f'#!/bin/sh\necho "$*" >> {log}\necho "Insufficient Permissions" >&2\n'
                    f"exit {exit_code}\n")  # fmt: skip
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}:/usr/bin:/bin")
    return log


def test_a_timeslice_row_sets_the_card_for_the_run_and_the_default_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = fake_nvidia_smi(tmp_path, monkeypatch)
    with gpu._timeslice(CARD, "short") as refused:
        assert refused is None
        assert log.read_text() == "compute-policy -i GPU-1234 --set-timeslice 1\n"
    assert log.read_text().splitlines()[1] == "compute-policy -i GPU-1234 --set-timeslice 0"


def test_a_refused_timeslice_skips_the_run_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvidia_smi(tmp_path, monkeypatch, exit_code=4)
    ran: list[str] = []
    monkeypatch.setattr(gpu, "_scenario_run_at", lambda sc, *_: ran.append(sc.name) or {})
    sc = gpu.chosen_scenarios("graph+gpt2_qshare_1ms_ts_short")[0]
    result = gpu._scenario_run(sc, 1.0, CARD)
    assert ran == []
    assert result["error"].startswith("timeslice short not set")
    assert "nvidia-smi exited with status 4: Insufficient Permissions" in result["error"]


def test_rows_without_a_timeslice_never_run_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = fake_nvidia_smi(tmp_path, monkeypatch)
    with gpu._timeslice(CARD, None) as refused:
        assert refused is None
    assert not log.exists()


def test_an_unknown_timeslice_level_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'tiny'"):
        gpu_timeslice.timeslice_argv("nvidia-smi", "GPU-1", "tiny")


def test_the_timeslice_set_names_only_known_scenarios() -> None:
    chosen = gpu.chosen_scenarios("@timeslice")
    assert {sc.timeslice for sc in chosen} == {None, "short"}
