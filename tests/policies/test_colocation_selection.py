"""`qshare bench colocation --only NAMES --rounds N --seconds S` runs the scenarios whose shape
and mode are named, each shape's modes interleaved N times, one median row per scenario with
its runs' spread; a name or a value it cannot take stops it with the option named."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from qshare.bench.coloc_select import Selection, SelectionError
from qshare.bench.colocation import run

SHAPES = ("steady", "bursty", "eager")
MODES = ("hp-alone", "qshare-1ms", "qshare-100ms")


def options(tmp_path: Path, **given: object) -> argparse.Namespace:
    fields = {"quick": True, "only": None, "rounds": None, "seconds": None, "replot": None,
              "out_dir": tmp_path} | given  # fmt: skip
    return argparse.Namespace(**fields)


def test_a_scenario_runs_when_its_shape_and_mode_are_named() -> None:
    chosen = Selection.parse("bursty,qshare-1ms", SHAPES, MODES)
    assert (chosen.shape("bursty"), chosen.shape("steady")) == (True, False)
    assert (chosen.mode("qshare-1ms"), chosen.mode("hp-alone")) == (True, False)


def test_a_kind_of_name_left_out_selects_all_of_it() -> None:
    chosen = Selection.parse("hp-alone", SHAPES, MODES)
    assert all(chosen.shape(s) for s in SHAPES)
    assert not chosen.everything


def test_an_unknown_name_is_refused_naming_it() -> None:
    with pytest.raises(SelectionError, match="unknown 'bursty2'"):
        Selection.parse("bursty2,hp-alone", SHAPES, MODES)


def test_an_empty_only_is_refused() -> None:
    with pytest.raises(SelectionError, match="no names"):
        Selection.parse(" , ", SHAPES, MODES)


@pytest.mark.parametrize(
    ("given", "named"), [({"rounds": 0}, "--rounds 0"), ({"seconds": -1.0}, "--seconds -1.0")]
)
def test_a_value_it_cannot_take_stops_it_naming_the_option(
    tmp_path: Path, given: dict[str, object], named: str
) -> None:
    with pytest.raises(SystemExit, match=named):
        run(options(tmp_path, only="bursty,hp-alone", **given))


def test_rounds_give_one_median_row_per_scenario_with_its_runs(tmp_path: Path) -> None:
    result = run(options(tmp_path, only="bursty,hp-alone,qshare-1ms", rounds=2, seconds=0.5))
    rows = {r["mode"]: r for r in result["scenarios"]}
    assert set(rows) == {"hp-alone", "qshare-1ms"}
    assert all(r["runs"] == 2 and r["hp_p99_ms"] in r["hp_p99_ms_runs"] for r in rows.values())
    assert result["policies"] == {}  # only a whole run measures the policies
