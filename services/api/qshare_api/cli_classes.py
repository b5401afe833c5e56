"""`qshare classes get|create|set|delete`: anyone shows one class (`GET
/v1/classes/{name}`); an administrator adds a class (`POST /v1/classes`:
the options left out take the API's defaults), changes one (`PATCH /v1/classes/{name}`: the
options given change, the others are kept) or deletes one no claim not yet ended names (one
that ended claims name is retired)."""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, Any

from qshare.contracts.domain import Provisioner
from qshare_api.cli import Shown, UsageError, command, named
from qshare_api.cli_history import classes_table
from qshare_api.client import Client, segment

if TYPE_CHECKING:
    from qshare_api.cli import Verbs

OPTIONS = {
    "description": "--description", "evictable": "--evictable",
    "eviction_grace_s": "--grace", "replace_on_failure": "--replace-on-failure",
    "starvation_share": "--starvation-share", "move_on_starvation": "--move-on-starvation",
}  # fmt: skip
"""Each field `set` may change, and its option."""
SWITCHES = {
    "evictable": "a high-priority claim may evict its low-priority claims",
    "replace_on_failure": "re-place its claims whose node or card fails",
    "move_on_starvation": "move its starved single-card claims",
}


def add_class_verbs(classes: Verbs) -> None:
    get = classes.add_parser("get", help="show one class")
    get.add_argument("name", type=named)
    get.set_defaults(handler=command(_get_class))
    create = classes.add_parser(
        "create", help="add a class; the options left out take their defaults (admins)"
    )
    create.add_argument("name", type=named)
    create.add_argument(
        "--provisioner", choices=[p.value for p in Provisioner], default=Provisioner.QSHARE.value,
        help="how its vGPUs are produced: driver-level slices or whole cards (default qshare)",
    )  # fmt: skip
    _class_options(create)
    create.set_defaults(handler=command(_create_class))
    change = classes.add_parser(
        "set", help="change a class: the options given change, the others are kept; its "
        "claims follow from their next decision on (admins)",
    )  # fmt: skip
    change.add_argument("name", type=named)
    _class_options(change)
    change.set_defaults(handler=command(_set_class))
    remove = classes.add_parser(
        "delete", help="delete a class no live claim names; if ended ones do, retire it (admins)"
    )
    remove.add_argument("name", type=named)
    remove.set_defaults(handler=command(_delete_class))


def _class_options(parser: argparse.ArgumentParser) -> None:
    """The options of a class's fields; one left out is not sent."""
    parser.add_argument("--description", default=argparse.SUPPRESS, help="what it is for")
    for field, help_ in SWITCHES.items():
        parser.add_argument(OPTIONS[field], dest=field, type=_yes_no, default=argparse.SUPPRESS,
                            metavar="yes|no", help=help_)  # fmt: skip
    parser.add_argument(
        "--grace", dest="eviction_grace_s", type=_number, default=argparse.SUPPRESS,
        metavar="SECONDS", help="how long an evicted claim keeps its vGPUs",
    )  # fmt: skip
    parser.add_argument(
        "--starvation-share", dest="starvation_share", type=_number, default=argparse.SUPPRESS,
        metavar="SHARE", help="0-1; 0: not watched",
    )  # fmt: skip


def _yes_no(value: str) -> bool:
    if value.lower() in ("yes", "true", "on"):
        return True
    if value.lower() in ("no", "false", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{value!r} is not yes or no")


def _number(value: str) -> float:
    """A finite number (the API judges its range): `nan` or `inf` would not reach it as JSON."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"{value!r} is not a number")
    return number


def _given(args: argparse.Namespace) -> dict[str, Any]:
    return {field: getattr(args, field) for field in OPTIONS if hasattr(args, field)}


def _get_class(client: Client, args: argparse.Namespace) -> Shown:
    found = client.get(f"/v1/classes/{segment(args.name)}")
    return Shown(found, classes_table([found]))


def _create_class(client: Client, args: argparse.Namespace) -> Shown:
    body = {"name": args.name, "provisioner": args.provisioner} | _given(args)
    created = client.post("/v1/classes", body, again=False)  # a second POST would be a 409
    return Shown(created, classes_table([created]))


def _set_class(client: Client, args: argparse.Namespace) -> Shown:
    body = _given(args)
    if not body:
        raise UsageError(f"give at least one of {', '.join(OPTIONS.values())}")
    changed = client.patch(f"/v1/classes/{segment(args.name)}", body)
    return Shown(changed, classes_table([changed]))


def _delete_class(client: Client, args: argparse.Namespace) -> Shown:
    client.delete(f"/v1/classes/{segment(args.name)}")
    return Shown({"name": args.name, "deleted": True}, f"class {args.name} deleted")
