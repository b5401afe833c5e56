"""The co-location figure reads as a table: one row per LP workload and mode, grouped by
workload, from plain co-location to qshare's longest release; it can be drawn again from a
saved run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qshare.bench.coloc_plots import _cases
from qshare.bench.colocation import replot

SAVED = Path(__file__).parents[2] / "docs" / "bench" / "colocation.json"


def test_rows_are_grouped_by_workload_from_plain_colocation_to_the_longest_release() -> None:
    points = [
        {"lp": "b", "mode": "qshare-auto"},
        {"lp": "a", "mode": "qshare-100ms"},
        {"lp": "b", "mode": "time-slicing"},
        {"lp": "a", "mode": "qshare-1ms"},
        {"lp": "a", "mode": "qshare-1ms"},
    ]
    assert _cases(points) == [
        ("a", "qshare-1ms"),
        ("a", "qshare-100ms"),
        ("b", "time-slicing"),
        ("b", "qshare-auto"),
    ]


def test_replot_draws_the_inflation_figure_of_a_saved_run(tmp_path: Path) -> None:
    result = replot(SAVED, tmp_path)
    figure = tmp_path / "colocation-inflation.png"
    assert result["figures"]["inflation_png"] == str(figure)
    assert figure.read_bytes()[:4] == b"\x89PNG"
    assert result["scenarios"] == json.loads(SAVED.read_text())["scenarios"]


def test_replot_of_a_file_that_is_not_a_saved_run_names_the_file(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text('{"benchmark": "gate"}')
    with pytest.raises(SystemExit, match=f"--replot {other}: not a saved run"):
        replot(other, tmp_path)
