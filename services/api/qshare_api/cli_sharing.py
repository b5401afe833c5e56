"""`qshare gpus get|share|reset-sharing`: one card in full, and how an admin asks a card to be
shared (policy, release delay fixed or auto, LP window, device gate, timeslice) or gives it
back to its node agent's settings, optionally waiting until the node has applied it."""

from __future__ import annotations

import argparse
import re
import time
from typing import TYPE_CHECKING, Any, get_args

from qshare.contracts.domain import CardPolicy
from qshare.contracts.sharing import AskedTimeslice, SharingSettings
from qshare_api.cli import (
    Shown,
    UsageError,
    WaitFailed,
    command,
    named,
    negative_values_allowed,
    table,
)
from qshare_api.client import Client, segment

if TYPE_CHECKING:
    from qshare_api.cli import Verbs

_UNITS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "": 1.0}
_DURATION = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(us|µs|ms|s)?\s*$")
POLL_S = 0.25


def add_sharing_verbs(gpus: Verbs) -> None:
    get = gpus.add_parser("get", help="one card: capacity and sharing, as reported and as asked")
    get.add_argument("uuid", type=named, help="the card, as `qshare gpus list` shows it")
    get.set_defaults(handler=command(_get))
    share = gpus.add_parser(
        "share", help="ask how a card is shared; what is left out keeps what was asked (admins)"
    )
    share.add_argument("uuid", type=named, help="the card, as `qshare gpus list` shows it")
    share.add_argument(
        "--policy", choices=[p.value for p in CardPolicy],
        help="how the card's low-priority vGPUs share it",
    )  # fmt: skip
    share.add_argument(
        "--release-mode", choices=["fixed", "auto"],
        help="fixed: --release-delay; auto: chosen up to it within --release-auto-bound",
    )  # fmt: skip
    share.add_argument(
        "--release-delay", dest="release_delay_s", type=duration, metavar="DURATION",
        help="e.g. 100ms; in auto mode, the longest it chooses",
    )  # fmt: skip
    share.add_argument(
        "--release-auto-bound", dest="release_auto_bound_s", type=duration, metavar="DURATION",
        help="auto mode: what it may add to high priority's p99, e.g. 2ms",
    )  # fmt: skip
    share.add_argument(
        "--lp-window", dest="lp_window_s", type=duration, metavar="DURATION",
        help="low priority's work in flight beside high priority, e.g. 500us",
    )  # fmt: skip
    share.add_argument(
        "--lp-device-gate", choices=["on", "off"],
        help="low priority's queued work waits on the card's gate on the GPU",
    )  # fmt: skip
    share.add_argument(
        "--timeslice", choices=list(get_args(AskedTimeslice)),
        help="the card's compute timeslice between processes (nvidia-smi; real cards)",
    )  # fmt: skip
    _wait_option(share)
    negative_values_allowed(share)  # `--release-delay -1ms` reaches `duration`
    share.set_defaults(handler=command(_share))
    reset = gpus.add_parser(
        "reset-sharing", help="withdraw what was asked: the node agent's settings again (admins)"
    )
    reset.add_argument("uuid", type=named, help="the card, as `qshare gpus list` shows it")
    _wait_option(reset)
    negative_values_allowed(reset)
    reset.set_defaults(handler=command(_reset))


def duration(value: str) -> float:
    """Seconds from `0.1`, `100ms`, `500us` or `2s`; a negative one is refused."""
    found = _DURATION.match(value)
    if found is None:
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration (e.g. 100ms, 500us, 0.1)")
    seconds = float(found.group(1)) * _UNITS[found.group(2) or ""]
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"must be ≥ 0, not {value!r}")
    return seconds or 0.0  # -0 is 0


def _wait_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wait", type=duration, metavar="DURATION",
        help="then wait up to DURATION for the node to apply it",
    )  # fmt: skip


def _get(client: Client, args: argparse.Namespace) -> Shown:
    card = client.get(f"/v1/gpus/{segment(args.uuid)}")
    return Shown(card, sharing_table(card))


def _share(client: Client, args: argparse.Namespace) -> Shown:
    given = {k: getattr(args, k) for k in SharingSettings.model_fields}
    body: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    if "lp_device_gate" in body:  # on|off on the command line
        body["lp_device_gate"] = body["lp_device_gate"] == "on"
    if not body:
        raise UsageError("name at least one of --policy, --release-mode, --release-delay, "
                         "--release-auto-bound, --lp-window, --lp-device-gate, "
                         "--timeslice")  # fmt: skip
    card = client.patch(f"/v1/gpus/{segment(args.uuid)}/sharing", body)
    return _shown(client, card, args.wait)


def _reset(client: Client, args: argparse.Namespace) -> Shown:
    return _shown(client, client.delete(f"/v1/gpus/{segment(args.uuid)}/sharing"), args.wait)


def _shown(client: Client, card: dict[str, Any], wait_s: float | None) -> Shown:
    if wait_s is not None:
        card = _until_applied(client, card, wait_s)
    return Shown(card, sharing_table(card))


def _until_applied(client: Client, card: dict[str, Any], wait_s: float) -> dict[str, Any]:
    """Poll the card until its node has applied what was asked (or its withdrawal); the node
    refusing it or the timeout ends the wait with an error."""
    deadline = time.monotonic() + wait_s
    while card["sharing_pending"]:
        if time.monotonic() >= deadline:
            raise WaitFailed(f"card {card['uuid']}: its node has not applied it yet", "pending")
        time.sleep(POLL_S)
        card = client.get(f"/v1/gpus/{segment(card['uuid'])}")
    if card["sharing_refused"]:
        raise WaitFailed(
            f"card {card['uuid']}: its node refused it: {card['sharing_refused']}", "refused"
        )
    return card


def sharing_table(card: dict[str, Any]) -> str:
    """The card's sharing as reported beside what was asked, a row per setting."""
    now, asked = card.get("sharing") or {}, card.get("sharing_requested") or {}
    rows = [
        (name, _value(now.get(name)), _value(asked.get(name), unset="(node's setting)"))
        for name in SharingSettings.model_fields
        if name != "timeslice"
    ]
    unset = "(QSHARE_NODE_TIMESLICE at the agent's start)"
    rows.append(("timeslice", _timeslice(now), _value(asked.get("timeslice"), unset=unset)))
    state = "refused: " + card["sharing_refused"] if card.get("sharing_refused") else (
        "pending" if card.get("sharing_pending") else "applied" if asked else "node's settings"
    )  # fmt: skip
    head = f"card {card['uuid']} on {card['node']} (index {card['index']}): {state}\n\n"
    return head + table(("SETTING", "NOW", "ASKED"), rows)


def _timeslice(now: dict[str, Any]) -> str:
    """The card's timeslice, and the level its agent was asked for when the card refused it."""
    level = _value(now.get("timeslice"))
    refused = now.get("timeslice_refused")
    return f"{level} (refused {refused})" if refused else level


def _value(value: object, unset: str = "-") -> str:
    if value is None:
        return unset
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)
