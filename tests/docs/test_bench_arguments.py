"""`qshare bench`'s shared options refuse what cannot be run, naming the option and value."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from qshare.bench import gpu
from qshare.bench.cli import register


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="qshare")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["bench", *argv])


REFUSED = [("--rounds", v) for v in ("0", "-1", "two", "1.5")] + [
    ("--seconds", v) for v in ("0", "-2", "nan", "inf", "ten")
]


@pytest.mark.parametrize(("option", "value"), REFUSED)
def test_rounds_and_seconds_that_are_not_a_finite_number_above_zero_are_refused(
    option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse("model", option, value)
    err = capsys.readouterr().err
    assert f"argument {option}:" in err and repr(value) in err


def test_rounds_and_seconds_in_range_are_taken() -> None:
    args = parse("model", "--rounds", "2", "--seconds", "0.5")
    assert (args.rounds, args.seconds) == (2, 0.5)


def test_bench_gpu_without_nvidia_smi_says_it_needs_a_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SystemExit, match="needs an NVIDIA GPU and its nvidia-smi"):
        gpu._gpu_identity()


@pytest.mark.parametrize("where", ["under a file", "a directory"])
def test_a_json_path_that_cannot_be_written_is_refused_before_the_run(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, the benchmark ran (minutes) and writing its figures ended in a traceback."""
    (tmp_path / "file").write_text("")
    given = tmp_path / "file" / "x.json" if where == "under a file" else tmp_path
    with pytest.raises(SystemExit):
        parse("model", "--json", str(given))
    err = capsys.readouterr().err
    assert f"argument --json: {str(given)!r} cannot be written" in err


def test_a_json_path_in_directories_not_made_yet_is_taken(tmp_path: Path) -> None:
    assert parse("model", "--json", str(tmp_path / "a" / "b.json")).json_path == (
        tmp_path / "a" / "b.json"
    )
