"""`qshare events watch`: follow qshare's events (`GET /v1/events`) as lines, one per event,
each opening with its sequence (`-o json`: an envelope a line; `-o yaml`: a document each),
until Ctrl-C or `--count` events; `--after N` resumes after sequence N, and a dropped
connection is resumed after the last event printed."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import yaml

from qshare_api.cli import Shown, command, group
from qshare_api.client import Client, Event

if TYPE_CHECKING:
    from qshare_api.cli import Sub

SHOWN = ("tenant", "status", "priority", "node", "gpu", "card", "vgpu", "pid", "value", "reason")
"""The fields a line shows when the event has them (`-o json` prints the whole envelope)."""
RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0, 8.0)
"""Waits before each attempt to reconnect after a stream is lost; then the watch gives up."""
STEADY_S = 10.0
"""A stream that lasted this long (or brought an event) starts the attempts over."""


def register(subparsers: Sub) -> None:
    events = group(subparsers, "events", "follow qshare's events as they happen")
    watch = events.add_parser(
        "watch",
        help="print each event, its sequence first; -o json or -o yaml prints its envelope",
    )
    watch.add_argument("--subject", help="a NATS subject under qshare.evt (default: all)")
    watch.add_argument("--count", type=_positive, help="stop after this many events")
    watch.add_argument(
        "--after", type=_sequence, metavar="N",
        help="the events after sequence N (as a line printed it), then the live ones",
    )  # fmt: skip
    watch.set_defaults(handler=command(_watch, streams=True))


def _positive(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number from 1")
    return int(value)


def _sequence(value: str) -> int:
    if not value.isdigit() or len(value) > 19:
        raise argparse.ArgumentTypeError(f"{value!r} is not an event's sequence (0 or more)")
    return int(value)


def _watch(client: Client, args: argparse.Namespace) -> Shown:
    stream = following(client, args.subject, args.after)
    for seen, event in enumerate(stream, start=1):
        print(shown(event, args.output), flush=True)
        if args.count is not None and seen >= args.count:
            break
    return Shown(None, "")


def following(client: Client, subject: str | None, after: int | None) -> Iterator[Event]:
    """The stream's events; when it is lost, the stream again after the last sequence seen,
    so no event is lost or shown twice (before any event with a sequence, from now on)."""
    tries = 0
    while True:
        began = time.monotonic()
        try:
            for event in client.events("/v1/events", subject=subject, after=after):
                tries, after = 0, after if event.sequence is None else event.sequence
                if event.subject:  # not the `id:` a stream ends with past events not shown
                    yield event
            why = "the API ended the stream"
        except httpx.TransportError as exc:  # refused, reset, cut short, timed out
            why = f"the stream was lost ({exc or type(exc).__name__})"
        if time.monotonic() - began >= STEADY_S:
            tries = 0
        if tries == len(RETRY_DELAYS_S):
            raise httpx.ReadError(f"{why}; gave up" + _resume_hint(after))
        _say(f"{why}; reconnecting" + ("" if after is None else f" after {after}"))
        time.sleep(RETRY_DELAYS_S[tries])
        tries += 1


def _resume_hint(after: int | None) -> str:
    return "" if after is None else f" (resume with --after {after})"


def _say(note: str) -> None:
    print(f"qshare events watch: {note}", file=sys.stderr, flush=True)


def shown(event: Event, output: str) -> str:
    """The event's line (`table`), or its envelope with `sequence` added: one JSON line
    (`json`), or one YAML document opening with `---` (`yaml`)."""
    envelope = json.loads(event.data)
    if output == "table":
        return line(event.sequence, event.subject, envelope)
    if event.sequence is not None and isinstance(envelope, dict):
        envelope["sequence"] = event.sequence
    if output == "yaml":
        return "---\n" + str(yaml.safe_dump(envelope, sort_keys=False)).rstrip()
    return json.dumps(envelope)


def line(sequence: int | None, subject: str, envelope: Any) -> str:
    """`SEQUENCE  TIME  SUBJECT  key=value …` with the fields of the event that say what
    happened (`-` for the sequence of a stream that sends none)."""
    data = envelope.get("data") if isinstance(envelope, dict) else None
    fields = data if isinstance(data, dict) else {}
    shown_ = " ".join(f"{k}={fields[k]}" for k in SHOWN if fields.get(k) is not None)
    when = str(envelope.get("time", ""))[:23] if isinstance(envelope, dict) else ""
    number = "-" if sequence is None else str(sequence)
    return f"{number}  {when}  {subject}  {shown_}".rstrip()
