"""`qshare bench <name>`: dispatches to the benchmark modules, prints their table, writes JSON."""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# name -> module exposing `run(args) -> dict` and `table(result) -> str`
BENCHMARKS: dict[str, str] = {
    "gate": "qshare.bench.gate",
    "colocation": "qshare.bench.colocation",
    "allocator": "qshare.bench.allocator",
    "hook": "qshare.bench.hook",
    "gpu": "qshare.bench.gpu",
    "cluster": "qshare.bench.cluster",
    "faults": "qshare.bench.faults",
    "chaos": "qshare.bench.chaos",
    "kubernetes": "qshare.bench.kubernetes",
    "sweep": "qshare.bench.sweep",
    "model": "qshare.bench.model",
}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("bench", help="run a benchmark and write its figures as JSON")
    parser.add_argument("name", choices=sorted(BENCHMARKS), help="which benchmark")
    parser.add_argument(
        "--json", dest="json_path", type=_json_target, help="write the figures here"
    )
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--out-dir", type=Path, default=Path(".bench"), help="plots and logs")
    parser.add_argument(
        "--nats-outage-s", type=float, help="faults: how long NATS stays down (default 180)"
    )
    parser.add_argument(
        "--volatile-postgres",
        action="store_true",
        help="cluster: Postgres without fsync, to show what durable commits cost on this disk",
    )
    parser.add_argument(
        "--replot",
        type=Path,
        metavar="JSON",
        help="colocation: draw the inflation figure again from a saved --json run, not running",
    )
    add_gpu_options(parser)
    parser.set_defaults(handler=run_benchmark)


def add_gpu_options(parser: argparse.ArgumentParser) -> None:
    """`qshare bench gpu` runs longer than one lease of a GPU machine allows: these split it."""
    parser.add_argument(
        "--rounds", type=_positive(int),
        help="gpu: interleaved rounds (default 3); colocation: of each scenario (default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--seconds", type=_positive(float),
        help="gpu: seconds per scenario (default 20); colocation: for every shape",
    )  # fmt: skip
    parser.add_argument(
        "--only",
        help="gpu: comma-separated scenario names to run, or @SET (@devgate, @diagnose); "
        "colocation: shapes and/or modes (e.g. bursty,hp-alone,qshare-1ms)",
    )
    parser.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="gpu: summarise the runs of earlier --json files (same GPU) instead of running",
    )


def _positive(kind: type[int] | type[float]) -> Callable[[str], float]:
    """An argparse type: a number of `kind` above 0, else an error naming the value."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"must be {what} > 0, not {text!r}") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be a finite number > 0, not {text!r}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _json_target(text: str) -> Path:
    """Where the figures go: refused now, not after a run of minutes, when it is a directory
    or its nearest existing directory is not one this user may write in (missing directories
    are made when the figures are written)."""
    path = Path(text)
    above = path.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if path.is_dir():
        why = "it is a directory"
    elif not above.is_dir():
        why = f"{above} is not a directory"
    elif not os.access(above, os.W_OK | os.X_OK):
        why = f"{above} is not writable by this user"
    else:
        return path
    raise argparse.ArgumentTypeError(f"{text!r} cannot be written: {why}")


def run_benchmark(args: argparse.Namespace) -> int:
    try:
        module = importlib.import_module(BENCHMARKS[args.name])
    except ModuleNotFoundError as exc:
        print(f"qshare bench: benchmark {args.name!r} is not available: {exc}", file=sys.stderr)
        return 2
    result: dict[str, Any] = module.run(args)
    print(module.table(result))
    if args.json_path is not None:
        try:
            args.json_path.parent.mkdir(parents=True, exist_ok=True)
            args.json_path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        except OSError as exc:
            print(f"qshare bench: the figures above were not written to {args.json_path}: "
                  f"{exc.strerror or exc}", file=sys.stderr)  # fmt: skip
            return 1
        print(f"figures written to {args.json_path}")
    return 0
