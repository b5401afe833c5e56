"""`qshare up`: the whole stack on this machine — embedded Postgres and NATS, allocator, API,
preemptor and simulated node agents — until Ctrl-C, then everything stops cleanly."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from qshare.contracts.quantities import parse_mib
from qshare.natsauth import ServiceRole
from qshare.stack import Stack, StackOptions, running_stack


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "up",
        help="run the whole stack locally on simulated nodes",
        description="Start embedded Postgres and NATS (JetStream), the allocator, the API, the "
        "preemptor and simulated node agents; print the URL and an admin token; stop on Ctrl-C.",
    )
    parser.add_argument("--nodes", type=_count(1, 64), default=2, help="simulated nodes (2)")
    parser.add_argument("--cards", type=_count(1, 16), default=2, help="cards per node (2)")
    parser.add_argument(
        "--card-memory", type=_card_memory, default="16Gi", help="memory per card (16Gi)"
    )
    parser.add_argument("--port", type=_count(1, 65535), default=8080, help="API port (8080)")
    parser.add_argument("--shm-dir", type=_directory, help="segments' directory (default /dev/shm)")
    parser.set_defaults(handler=run_up)


def _count(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not text.isdigit() or not low <= int(text) <= high:
            raise argparse.ArgumentTypeError(f"expected an integer {low}..{high}, got {text!r}")
        return int(text)

    return parse


def _directory(text: str) -> Path:
    """The segments' directory: one that exists and this user may write in (each simulated
    node agent creates its segment there once everything else has started)."""
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text!r} is not writable by this user")
    return path


def _card_memory(text: str) -> str:
    """A simulated card's memory, as the node agent takes it: whole Mi, Gi or Ti, at least 1Gi."""
    hint = f" (did you mean {text}i?)" if re.fullmatch(r"[0-9]+[MGT]", text) else ""
    if not re.fullmatch(r"[0-9]+(Mi|Gi|Ti)", text) or parse_mib(text) < 1024:
        raise argparse.ArgumentTypeError(f"expected at least 1Gi, such as 16Gi, got {text!r}{hint}")
    return text


def run_up(args: argparse.Namespace) -> int:
    options = StackOptions(nodes=args.nodes, cards=args.cards, card_memory=args.card_memory,
                           port=args.port, shm_dir=args.shm_dir)  # fmt: skip
    try:
        _check_port_free(options.host, options.port)
        asyncio.run(_serve(options))
    except OSError as exc:
        print(f"qshare up: {exc}", file=sys.stderr)
        return 2
    return 0


def _check_port_free(host: str, port: int) -> None:
    """Refuse a port something listens on before starting anything (the API binds it last,
    after Postgres, NATS and the services have started)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise OSError(f"port {port} on {host} is in use ({exc.strerror}): "
                          "choose another with --port") from exc  # fmt: skip


async def _serve(options: StackOptions) -> None:
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    print("qshare up: starting Postgres, NATS, allocator, API, preemptor, node agents ...")
    async with running_stack(options) as stack:
        print(describe(stack))
        await stop.wait()
        print("qshare up: stopping ...")
    print("qshare up: stopped")


def describe(stack: Stack) -> str:
    nodes = ", ".join(f"{a.name} ({len(a.cards)} cards)" for a in stack.agents)
    first = stack.agents[0].name
    reader = stack.identities.credentials(ServiceRole.INTEGRATION)
    return "\n".join([
        f"API      {stack.url}   (docs: {stack.url}/docs)",
        f"token    {stack.admin_token}   (admin)",
        f"NATS     {stack.nats_url}   (read-only events: user {reader.user}, password "
        f"{reader.password.get_secret_value()})",
        f"nodes    {nodes}",
        "",
        f"export QSHARE_URL={stack.url} QSHARE_TOKEN={stack.admin_token}",
        "qshare claims create --priority low --vcore 50 --vmemory 4Gi",
        f"QSHARE_NODE_NAME={first} qshare run --claim ID -- CMD    # on the claim's node",
        "Ctrl-C stops everything.",
    ])  # fmt: skip
