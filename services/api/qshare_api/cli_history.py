"""`qshare preemptions|starvation|classes …`: listings over the REST API: suspensions and
evictions, starved low-priority claims, and the GPU classes (which admins change and
delete)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from qshare_api.cli import CLAIM_HELP, Shown, claim_id, command, group, resolve_claim, table
from qshare_api.cli_admin import day
from qshare_api.client import Client

if TYPE_CHECKING:
    from qshare_api.cli import Sub

PREEMPTION_KINDS = ("gang", "operator", "eviction")
PREEMPTION_COLUMNS = ("ID", "CLAIM", "TENANT", "KIND", "NODE", "CARD", "STARTED", "SECONDS",
                      "BY", "REASON")  # fmt: skip
STARVATION_COLUMNS = ("ID", "CLAIM", "TENANT", "NODE", "CARD", "SHARE", "HARVESTABLE", "OPEN",
                      "MOVED_TO", "STARTED")  # fmt: skip
CLASS_COLUMNS = ("NAME", "PROVISIONER", "EVICTABLE", "GRACE", "REPLACE", "STARVATION", "MOVE",
                 "DESCRIPTION")  # fmt: skip


def register(subparsers: Sub) -> None:
    preemptions = group(subparsers, "preemptions", "suspensions and evictions of claims")
    listing = preemptions.add_parser("list", help="list preemptions, newest first")
    _history_options(listing)
    listing.add_argument(
        "--kind", choices=PREEMPTION_KINDS,
        help="gang, operator (claims suspend) or eviction (memory taken back)",
    )  # fmt: skip
    listing.set_defaults(handler=command(_list_preemptions))
    starvation = group(subparsers, "starvation", "low-priority claims found starved")
    starved = starvation.add_parser("list", help="list starved claims, newest first")
    _history_options(starved)
    starved.set_defaults(handler=command(_list_starvation))
    classes = group(subparsers, "classes", "GPU classes that claims name with --class")
    classes.add_parser("list", help="list classes").set_defaults(handler=command(_list_classes))
    from qshare_api.cli_classes import add_class_verbs  # it builds on this module

    add_class_verbs(classes)


def _history_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--claim", type=claim_id, help=f"only this claim: {CLAIM_HELP}")
    parser.add_argument(
        "--limit", type=_limit, default=100, help="most recent records, 1-500 (default 100)"
    )
    parser.add_argument(
        "--before", type=_record_id, metavar="ID",
        help="the records older than record ID (the last of a page, as it printed)",
    )  # fmt: skip


def _record_id(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) < 2**63:
        raise argparse.ArgumentTypeError(f"{value!r} is not a record id (as a listing shows)")
    return int(value)


def _more(found: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """A full page may have older records after it: how to list them."""
    return f"\n(more: --before {found[-1]['id']})" if len(found) == args.limit else ""


def _limit(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 500:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number from 1 to 500")
    return int(value)


def _claim_filter(client: Client, args: argparse.Namespace) -> str | None:
    return resolve_claim(client, args.claim, "--claim") if args.claim else None


def _list_preemptions(client: Client, args: argparse.Namespace) -> Shown:
    found = client.get(
        "/v1/preemptions", claim=_claim_filter(client, args), kind=args.kind, limit=args.limit,
        before=args.before,
    )  # fmt: skip
    rows = [
        (p["id"], p["claim_id"], p["tenant"], p["kind"], p["node"] or "-", p["gpu"] or "-",
         day(p["started_at"]), _seconds(p["seconds"]), p.get("suspended_by") or "-",
         p["reason"])
        for p in found
    ]  # fmt: skip
    return Shown(found, table(PREEMPTION_COLUMNS, rows) + _more(found, args))


def _seconds(value: float | None) -> str:
    """A finished preemption's length; an open one is still going."""
    return "open" if value is None else f"{value:.1f}"


def _list_starvation(client: Client, args: argparse.Namespace) -> Shown:
    found = client.get(
        "/v1/starvation", claim=_claim_filter(client, args), limit=args.limit,
        before=args.before,
    )  # fmt: skip
    rows = [
        (s["id"], s["claim_id"], s["tenant"], s["node"], s["gpu"], _percent(s["share"]),
         _percent(s["harvestable_share"]), "yes" if s["open"] else "no", s["moved_to"] or "-",
         day(s["started_at"]))
        for s in found
    ]  # fmt: skip
    return Shown(found, table(STARVATION_COLUMNS, rows) + _more(found, args))


def _percent(share: float) -> str:
    return f"{share * 100:.0f}%"


def _list_classes(client: Client, args: argparse.Namespace) -> Shown:
    found: list[dict[str, Any]] = client.get("/v1/classes")
    return Shown(found, classes_table(found))


def classes_table(found: list[dict[str, Any]]) -> str:
    rows = [
        (c["name"], c["provisioner"], _yes(c["evictable"]), f"{c['eviction_grace_s']:g}s",
         _yes(c["replace_on_failure"]), _watched(c["starvation_share"]),
         _yes(c["move_on_starvation"]), c["description"] or "-")
        for c in found
    ]  # fmt: skip
    return table(CLASS_COLUMNS, rows)


def _watched(share: float) -> str:
    """A class's starvation share; 0 means its claims are not watched."""
    return _percent(share) if share else "off"


def _yes(value: bool) -> str:
    return "yes" if value else "no"
