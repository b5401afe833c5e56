"""`qshare check`: whether this machine can run a node agent with the settings it would be
started with (QSHARE_NODE_*, QSHARE_K8S_* and these flags), before one is: a row per check,
exit 1 when any fails (qshare_node_agent.preflight)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

EXIT_FAILED = 1
EXIT_BAD_SETTINGS = 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "check", help="check this machine can run a node agent (cards, CUDA, NATS, kubelet)",
        description="Check, without changing anything, that a node agent started here with "
        "these settings (flags, else QSHARE_NODE_* and QSHARE_K8S_*) would find its cards, "
        "its segment directory, the interposer and the CUDA driver, set the timeslice it is "
        "asked for, reach NATS and, with QSHARE_NODE_KUBERNETES, the kubelet's directories.",
    )  # fmt: skip
    p.add_argument("--name", help="node name (default: the host name)")
    p.add_argument("--nats-url", help="NATS server (default nats://localhost:4222)")
    p.add_argument("--simulate", metavar="N[:MEM]", help="N simulated cards instead of NVML")
    p.add_argument("--shm-dir", type=Path, help="segment directory (default /dev/shm)")
    p.add_argument("--nats-timeout", type=_seconds, default=3.0, metavar="SECONDS",
                   help="how long to wait for NATS (default 3)")  # fmt: skip
    p.add_argument("--no-nats", action="store_true", help="skip the NATS check")
    p.add_argument("--json", action="store_true", help="the findings as JSON")
    p.set_defaults(handler=main)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 600:
        raise argparse.ArgumentTypeError(f"{text!r}: give more than 0 and at most 600 seconds")
    return value


def main(args: argparse.Namespace) -> int:
    from qshare.envsettings import SettingsError, report
    from qshare_node_agent.preflight import Machine, failed, run_checks

    try:
        settings, k8s = _settings(args)
    except SettingsError as exc:
        return report(exc, "qshare check")
    timeout = None if args.no_nats else args.nats_timeout
    findings = asyncio.run(run_checks(settings, k8s, Machine.this_one(), timeout))
    _show(findings, args.json)
    return EXIT_FAILED if failed(findings) else 0


def _settings(args: argparse.Namespace) -> tuple[Any, Any]:
    """The agent's settings, as `python -m qshare_node_agent` would load them."""
    from qshare_node_agent.settings import load_agent_settings

    names = ("name", "nats_url", "simulate", "shm_dir")
    return load_agent_settings({k: getattr(args, k) for k in names if getattr(args, k) is not None})


def _show(findings: list[Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps([f.as_json() for f in findings], indent=2))
        return
    width = max(len(f.check) for f in findings)
    for f in findings:
        print(f"{f.check:<{width}}  {f.status:<4}  {f.detail}")
    sys.stdout.flush()
