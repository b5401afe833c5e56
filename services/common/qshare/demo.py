"""`qshare demo`: the main job on a simulated node — co-location through the real driver,
the co-location benchmark's headline, then the control plane with embedded Postgres and
NATS placing claims of both priorities."""

from __future__ import annotations

import argparse
import asyncio
import importlib
from collections.abc import Callable


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("demo", help="run the co-location and control-plane demo")
    parser.add_argument(
        "--part",
        choices=("all", "colocation", "headline", "controlplane", "cluster"),
        default="all",
        help="run one part only",
    )
    parser.set_defaults(handler=run_demo)


def _section(title: str) -> None:
    print(f"\n=== {title} ===")


def _colocation(out: Callable[[str], None]) -> None:
    from qshare.demo_colocation import run_colocation_demo

    run_colocation_demo(out)


def _headline(out: Callable[[str], None]) -> None:
    module = importlib.import_module("qshare.bench.colocation")
    module.run_colocation_headline(out)


def _controlplane(out: Callable[[str], None]) -> None:
    module = importlib.import_module("qshare.demo_controlplane")
    asyncio.run(module.run_controlplane_demo(out))


def _cluster(out: Callable[[str], None]) -> None:
    module = importlib.import_module("qshare.demo_cluster")
    asyncio.run(module.run_cluster_demo(out))


PARTS: dict[str, tuple[str, Callable[[Callable[[str], None]], None]]] = {
    "colocation": ("co-location on one simulated card (driver)", _colocation),
    "headline": ("co-location benchmark, short run", _headline),
    "controlplane": ("control plane: placement over REST, NATS and Postgres", _controlplane),
    "cluster": ("the cluster loop: claims become running vGPUs, preemption, events", _cluster),
}


def run_demo(args: argparse.Namespace) -> int:
    chosen = list(PARTS) if args.part == "all" else [args.part]
    for name in chosen:
        title, part = PARTS[name]
        _section(title)
        part(print)
    return 0
