"""`python -m qshare_node_agent`: run one node agent (settings also from QSHARE_NODE_*)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from pathlib import Path


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m qshare_node_agent",
        description="The qshare node agent: one per GPU node. Settings come from these flags "
        "or from QSHARE_NODE_* variables.",
    )
    p.add_argument("--name", help="node name (default: the host name)")
    p.add_argument("--nats-url", help="NATS server (default nats://localhost:4222)")
    p.add_argument(
        "--simulate", metavar="N[:MEM]",
        help="N simulated cards of MEM each (e.g. 2:16Gi; default 16Gi) instead of NVML",
    )  # fmt: skip
    p.add_argument("--segment", help="driver segment name (default qshare-<name>)")
    p.add_argument("--shm-dir", type=Path, help="segment directory (default /dev/shm)")
    p.add_argument("--policy", help="card policy: best-effort, fixed-share, burst-share")
    p.add_argument("--release-delay-s", type=float, help="release delay (default 0.1)")
    p.add_argument(
        "--release-auto-bound-s", type=float,
        help="auto release: high priority's p99 grows by at most this (delay up to the release "
        "delay)",
    )  # fmt: skip
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics here")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from qshare.contracts.tracing import otlp_settings
    from qshare.envsettings import SettingsError, report
    from qshare.health import ListenError
    from qshare_driver import DriverError
    from qshare_node_agent.app import NodeAgent
    from qshare_node_agent.discovery import DiscoveryError
    from qshare_node_agent.settings import load_agent_settings

    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    given = {k: v for k, v in vars(args).items() if v is not None}
    try:
        settings, _ = load_agent_settings(given)
        otlp_settings()
    except SettingsError as exc:
        return report(exc, "qshare node agent")
    try:
        asyncio.run(NodeAgent(settings).run())
    except DiscoveryError as exc:
        print(f"qshare node agent: {exc}", file=sys.stderr)
        return 2
    except (ListenError, DriverError, OSError) as exc:
        # DriverError: the segment refused at start; OSError: its NATS identity file missing
        # or unreadable (`python -m qshare.natsauth init DIR --node NAME` makes it)
        print(f"qshare node agent: cannot start: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
