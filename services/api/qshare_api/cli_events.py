"""`qshare events watch`: follow qshare's events (`GET /v1/events`) as lines, one per event,
until Ctrl-C or `--count` events."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from qshare_api.cli import Shown, command, group
from qshare_api.client import Client

if TYPE_CHECKING:
    from qshare_api.cli import Sub

SHOWN = ("tenant", "status", "priority", "node", "gpu", "card", "vgpu", "pid", "value", "reason")
"""The fields a line shows when the event has them (`-o json` prints the whole envelope)."""


def register(subparsers: Sub) -> None:
    events = group(subparsers, "events", "follow qshare's events as they happen")
    watch = events.add_parser("watch", help="print each event; -o json prints its envelope")
    watch.add_argument("--subject", help="a NATS subject under qshare.evt (default: all)")
    watch.add_argument("--count", type=_positive, help="stop after this many events")
    watch.set_defaults(handler=command(_watch, streams=True))


def _positive(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number from 1")
    return int(value)


def _watch(client: Client, args: argparse.Namespace) -> Shown:
    stream = client.events("/v1/events", subject=args.subject)
    for seen, (subject, data) in enumerate(stream, start=1):
        print(data if args.output == "json" else line(subject, json.loads(data)), flush=True)
        if args.count is not None and seen >= args.count:
            break
    return Shown(None, "")


def line(subject: str, envelope: dict[str, Any]) -> str:
    """`TIME  SUBJECT  key=value …` with the fields of the event that say what happened."""
    data = envelope.get("data")
    fields = data if isinstance(data, dict) else {}
    shown = " ".join(f"{k}={fields[k]}" for k in SHOWN if fields.get(k) is not None)
    return f"{str(envelope.get('time', ''))[:23]}  {subject}  {shown}".rstrip()
