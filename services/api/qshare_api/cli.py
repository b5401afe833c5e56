"""`qshare claims|nodes|gpus …`: people's command line over the REST API, as readable tables."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from qshare.contracts.domain import ClaimStatus
from qshare.contracts.quantities import QuantityError, format_mib, parse_mib
from qshare_api.client import (
    ApiError,
    BadConnectionSetting,
    Client,
    NotTheApi,
    redacted,
    segment,
)

if TYPE_CHECKING:
    Sub = argparse._SubParsersAction[argparse.ArgumentParser]

GPU_COLUMNS = (
    "NODE", "IDX", "UUID", "MODEL", "HEALTHY", "VGPUS", "MEMORY", "FREE", "HIGH_FREE", "LOW_FREE",
)  # fmt: skip
"""HIGH_FREE/LOW_FREE: core share still free for each priority (the demo shows *_USED)."""
CLAIM_COLUMNS = ("ID", "TENANT", "STATUS", "PRIO", "VCORE", "VMEM", "COUNT", "NODE", "CARDS")
DEFAULT_URL = "http://127.0.0.1:8080"
WAIT_POLL_S = 0.25
CLAIM_HELP = "the claim's id, or its first 8 hex digits or more (one of your claims)"
FINAL_STATUSES = (ClaimStatus.RELEASED.value, ClaimStatus.FAILED.value)
"""A claim in these statuses never changes again: `claims wait` stops there."""


def register(subparsers: Sub) -> None:
    claims = group(
        subparsers,
        "claims",
        "create, list, get, wait for, resize, suspend, resume and delete claims",
    )
    create = claims.add_parser("create", help="ask for vGPUs")
    create.add_argument(
        "--priority", required=True, choices=["high", "low"],
        help="high: gets the card at once; low: harvests what high leaves idle",
    )  # fmt: skip
    create.add_argument("--vcore", required=True, type=int, help="core share per card, 1-100")
    create.add_argument(
        "--vmemory", required=True, type=memory, help="memory per card: MiB or e.g. 4Gi"
    )
    create.add_argument("--count", type=int, default=1, help="cards, on one node (default 1)")
    create.add_argument(
        "--class", dest="class_name", default="qshare",
        help="default qshare (a slice); whole: empty cards, each taken entirely",
    )  # fmt: skip
    create.add_argument(
        "--selector", action="append", default=[], metavar="KEY=VALUE", type=_selector_pair,
        help="only nodes with this label; repeat for several",
    )  # fmt: skip
    create.add_argument(
        "--node-policy", choices=["spread", "binpack"], help="default: the cluster's"
    )
    create.add_argument(
        "--card-policy", choices=["spread", "binpack"], help="default: the cluster's"
    )
    create.add_argument("--idempotency-key", help="default: a fresh one, so a retry is safe")
    create.add_argument(
        "--gang", help="a name your claims share to be suspended and resumed together"
    )
    create.add_argument(
        "--wait", type=_seconds, metavar="SECONDS",
        help="then wait up to SECONDS for it to be ready",
    )  # fmt: skip
    negative_values_allowed(create)  # `--vmemory -4Gi` reaches its check, which names it
    create.set_defaults(handler=command(_create_claim))
    listing = claims.add_parser("list", help="list claims")
    listing.add_argument(
        "--status", choices=[s.value for s in ClaimStatus], help="only claims in this status"
    )
    listing.add_argument("--priority", choices=["high", "low"], help="only this priority")
    listing.add_argument("--node", help="only claims on this node")
    listing.add_argument(
        "--tenant", type=named, help="only this tenant's claims (admins; a tenant only its own)"
    )
    listing.add_argument("--limit", type=int, default=50, help="claims per page (default 50)")
    listing.add_argument("--cursor", help="the next page, as a previous listing printed it")
    listing.set_defaults(handler=command(_list_claims))
    one_claim_verbs = (
        ("get", _get_claim, "get one claim"),
        ("delete", _delete_claim, "delete one claim, releasing its vGPUs"),
        ("suspend", _suspend_claim, "suspend a claim's processes at their next launch"),
        ("resume", _resume_claim, "resume a suspended claim"),
    )
    for verb, action, help_ in one_claim_verbs:
        one = claims.add_parser(verb, help=help_)
        one.add_argument("claim_id", type=claim_id, help=CLAIM_HELP)
        if verb in ("suspend", "resume"):
            one.add_argument("--reason", type=_reason, help=f"why, kept in the record ({verb})")
        one.set_defaults(handler=command(_on_claim(action)))
    resize = claims.add_parser("resize", help="change a claim's core share or memory per card")
    resize.add_argument("claim_id", type=claim_id, help=CLAIM_HELP)
    resize.add_argument("--vcore", type=int, help="core share per card, 1-100")
    resize.add_argument("--vmemory", type=memory, help="memory per card: MiB or e.g. 8Gi")
    resize.set_defaults(handler=command(_on_claim(_resize_claim)))
    wait = claims.add_parser(
        "wait", help="wait until a claim reaches a status (a claim not found counts as released)"
    )
    wait.add_argument("claim_id", type=claim_id, help=CLAIM_HELP)
    wait.add_argument(
        "--for", dest="until", default="ready", choices=[s.value for s in ClaimStatus],
        help="the status to wait for (default ready)",
    )  # fmt: skip
    wait.add_argument("--timeout", type=_seconds, default=60.0, help="seconds (default 60)")
    wait.set_defaults(handler=command(_on_claim(_wait_claim)))
    nodes = group(subparsers, "nodes", "the inventory of nodes")
    nodes.add_parser("list", help="list nodes").set_defaults(handler=command(_list_nodes))
    get_node = nodes.add_parser("get", help="get one node")
    get_node.add_argument("name", type=named)
    get_node.set_defaults(handler=command(_get_node))
    delete_node = nodes.add_parser(
        "delete", help="remove a node, or one of its cards, from the inventory; its claims "
        "there turn failed (a live agent registers it again); admins",
    )  # fmt: skip
    delete_node.add_argument("name", type=named)
    delete_node.add_argument("--card", type=named, metavar="UUID", help="only this card")
    delete_node.set_defaults(handler=command(_delete_node))
    for verb, help_ in (
        ("cordon", "place nothing new on a node (its claims keep running); admins"),
        ("uncordon", "place on a node again; admins"),
    ):
        one_node = nodes.add_parser(verb, help=help_)
        one_node.add_argument("name", type=named)
        one_node.set_defaults(handler=command(_cordon), schedulable=verb == "uncordon")
    gpus = group(subparsers, "gpus", "cards and their free capacity")
    gpu_list = gpus.add_parser("list", help="list cards")
    gpu_list.add_argument("--node", help="only this node's cards")
    gpu_list.set_defaults(handler=command(_list_gpus))
    from qshare_api.cli_sharing import add_sharing_verbs  # it builds on this module

    add_sharing_verbs(gpus)


def named(value: str) -> str:
    """A node's, tenant's or card's name, as given (the API judges it), but not empty: an
    empty one would name the collection, not one of it."""
    if not value.strip():
        raise argparse.ArgumentTypeError(f"{value!r} is empty: give a name")
    return value


def group(subparsers: Sub, name: str, help_: str) -> Verbs:
    """The group `name`; `--url`, `--token` and `-o` go before or after its verb."""
    parser = subparsers.add_parser(name, help=help_)
    _connection_options(parser, defaults=True)
    return Verbs(parser.add_subparsers(dest="action", required=True))


class Verbs:
    """A group's verbs, each of which takes the connection options too."""

    def __init__(self, subparsers: Sub) -> None:
        self._subparsers = subparsers
        self._leaf = argparse.ArgumentParser(add_help=False)
        _connection_options(self._leaf, defaults=False)

    def add_parser(self, verb: str, help: str) -> argparse.ArgumentParser:
        parser = self._subparsers.add_parser(verb, help=help, parents=[self._leaf])
        parser.set_defaults(verb_parser=parser)  # an API error names this verb's options
        return parser


def _connection_options(parser: argparse.ArgumentParser, defaults: bool) -> None:
    """With `defaults`, the group's; without, a verb's, which leave the group's value alone
    unless given (`qshare claims list -o json` and `qshare claims -o json list` agree)."""

    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--url", default=default(os.environ.get("QSHARE_URL", DEFAULT_URL)),
        help=f"the qshare API, or $QSHARE_URL (default {DEFAULT_URL})",
    )  # fmt: skip
    token = os.environ.get("QSHARE_TOKEN")
    parser.add_argument("--token", default=default(token), help="bearer token, or $QSHARE_TOKEN")
    parser.add_argument(
        "-o", "--output", choices=["table", "json", "yaml"], default=default("table"),
        help="output format (default table)",
    )  # fmt: skip


class UsageError(Exception):
    """Arguments argparse accepted one by one but not together."""


class WaitFailed(Exception):
    """`claims wait` ended without the status it waited for; `status` is the claim's then."""

    def __init__(self, message: str, status: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Shown:
    """What a command answered (for `-o json|yaml`) and how a table shows it."""

    data: Any
    text: str


_NEGATIVE_VALUE = re.compile(r"^-\.?[0-9]")


def negative_values_allowed(parser: argparse.ArgumentParser) -> None:
    """Let `--option -4Gi` or `--option -1ms` reach the option's own check, which names it and
    says why the value is refused: argparse takes a dash and a digit followed by more than
    digits for an unknown option, and says the option lacks its argument."""
    parser._negative_number_matcher = _NEGATIVE_VALUE


def command(
    action: Callable[[Client, argparse.Namespace], Shown], streams: bool = False
) -> Callable[[argparse.Namespace], int]:
    """The handler of a verb: it prints what `action` answered (unless the action `streams`,
    printing as it goes) and turns failures into a message and an exit status."""

    def handler(args: argparse.Namespace) -> int:
        try:
            shown = action(Client(args.url, args.token), args)
            if not streams:
                print(_render(shown, args.output))
        except ApiError as exc:
            _report(exc, args.token, getattr(args, "verb_parser", None))
            return 1
        except (UsageError, BadConnectionSetting) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except WaitFailed as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except httpx.HTTPError as exc:
            print(f"error: cannot reach the qshare API at {redacted(args.url)}: {redacted(exc)}",
                  file=sys.stderr)  # fmt: skip
            return 2
        except NotTheApi as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0

    return handler


def _render(shown: Shown, output: str) -> str:
    if output == "json":
        return json.dumps(shown.data, indent=2)
    if output == "yaml":
        import yaml

        return str(yaml.safe_dump(shown.data, sort_keys=False)).rstrip()
    return shown.text


FLAGS = {
    "class_name": "--class", "node_selector": "--selector", "expires_in_s": "--expires-in",
    "idempotency_key": "--idempotency-key", "eviction_grace_s": "--grace",
    "starvation_share": "--starvation-share", "replace_on_failure": "--replace-on-failure",
    "move_on_starvation": "--move-on-starvation", "placement.node": "--node-policy",
    "placement.card": "--card-policy",
}  # fmt: skip
"""The API's fields whose CLI option is not `--` and the field's name (a verb's options are
looked up too: `vcore` is `--vcore`, `lp_window_s` `--lp-window`, a positional `TENANT`):
an error names what the user typed."""
PYDANTIC_WORDS = (
    (re.compile(r"^(Input|String|List|Value) should "), "must "),
    (re.compile(r"^Field required$"), "is required"),
    (re.compile(r"less than or equal to"), "at most"),
    (re.compile(r"greater than or equal to"), "at least"),
)
"""pydantic's wording of a bound or a type, said as the CLI says its own errors."""
NO_TOKEN_HINT = (
    "give a token with --token or $QSHARE_TOKEN (`qshare up` prints an admin token; "
    "an admin issues others with `qshare tokens create`)"
)


def _report(exc: ApiError, token: str | None, verb: argparse.ArgumentParser | None) -> None:
    """The problem once: its field errors when it names fields, else its detail."""
    errors = exc.problem.get("errors") or []
    if not errors:
        print(f"error {exc.status}: {exc}", file=sys.stderr)
        if exc.status == 401 and not token:
            print(f"  {NO_TOKEN_HINT}", file=sys.stderr)
        return
    print(f"error {exc.status}: {exc.problem.get('title', 'invalid request')}", file=sys.stderr)
    for item in errors:
        field = option_of(str(item.get("field")), verb)
        print(f"  {field}: {cli_words(str(item.get('message', '')))}", file=sys.stderr)
    if exc.status == 409 and "quota of" in str(exc):
        print("  `qshare quotas show` gives your quota and what you use", file=sys.stderr)


def option_of(field: str, verb: argparse.ArgumentParser | None) -> str:
    """The option (or positional, as its usage line names it) of `verb` that gave the API's
    `field`; the field itself where the verb has none (`body`)."""
    if field in FLAGS:
        return FLAGS[field]
    wanted = {field, field.removesuffix("_s"), field.removesuffix("_mib")}
    dashed = {w.replace("_", "-") for w in wanted}
    for action in verb._actions if verb is not None else []:
        if action.dest in wanted or _long_option(action) in {f"--{w}" for w in dashed}:
            return _long_option(action) or str(action.metavar or action.dest.upper())
    return field


def _long_option(action: argparse.Action) -> str | None:
    return next((o for o in action.option_strings if o.startswith("--")), None)


def cli_words(message: str) -> str:
    """An API field error's message as the CLI words its own: `must be at most 100`, not
    pydantic's `Input should be less than or equal to 100`."""
    message = message.removeprefix("Value error, ")
    for pattern, words in PYDANTIC_WORDS:
        message = pattern.sub(words, message)
    return message


def memory(value: str) -> int | str:
    """Checked here, before any request (parse_mib's message hints that `4G`, 10^9 bytes,
    is probably meant as `4Gi`, 4096 MiB)."""
    try:
        parse_mib(int(value) if value.isdigit() else value)
    except QuantityError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return int(value) if value.isdigit() else value


def _selector_pair(value: str) -> tuple[str, str]:
    key, sep, label = value.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{value!r} is not KEY=VALUE")
    return key, label


def _selector(pairs: list[tuple[str, str]]) -> dict[str, str]:
    keys = [k for k, _ in pairs]
    if repeated := sorted({k for k in keys if keys.count(k) > 1}):
        raise UsageError(f"--selector repeats {', '.join(repeated)}: give each key once")
    return dict(pairs)


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= 86400:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds from 0 to 86400")
    return seconds


def claim_id(value: str) -> str:
    """A whole claim id, or the start of one (8 hex digits or more; a trailing `…` or
    `...`, as the demo prints one, is dropped), resolved later by `resolve_claim`."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        prefix = value.strip().removesuffix("…").removesuffix("...").lower()
    if re.fullmatch(r"[0-9a-f]{8}[0-9a-f-]{0,27}", prefix):
        return prefix
    raise argparse.ArgumentTypeError(
        f"{value!r} is not a claim id (a UUID, or its first 8 hex digits or more)"
    )


def resolve_claim(client: Client, claim: str, option: str = "claim id") -> str:
    """The one id of the caller's claims (the API lists only those) that starts with
    `claim`; a UsageError naming `option` and the claims when none or several do."""
    if len(claim) == 36:
        return claim
    found = [c["id"] for c in _all_claims(client) if str(c["id"]).startswith(claim)]
    if not found:
        raise UsageError(f"{option}: no claim of yours starts with {claim} (`qshare claims list`)")
    if len(found) > 1:
        several = ", ".join(found)
        raise UsageError(f"{option}: {claim} starts several claims: {several}; give more digits")
    return str(found[0])


def _all_claims(client: Client) -> Iterator[dict[str, Any]]:
    cursor = None
    while True:
        page = client.get("/v1/claims", limit=500, cursor=cursor)
        yield from page["items"]
        if not (cursor := page.get("next_cursor")):
            return


def _on_claim(
    action: Callable[[Client, argparse.Namespace], Shown],
) -> Callable[[Client, argparse.Namespace], Shown]:
    """`action` with `args.claim_id` resolved from a prefix to the whole id first."""

    def resolved(client: Client, args: argparse.Namespace) -> Shown:
        args.claim_id = resolve_claim(client, args.claim_id)
        return action(client, args)

    return resolved


def _create_claim(client: Client, args: argparse.Namespace) -> Shown:
    body: dict[str, Any] = {
        "priority": args.priority,
        "vcore": args.vcore,
        "vmemory": args.vmemory,
        "count": args.count,
        "class_name": args.class_name,
        "node_selector": _selector(args.selector),
        "idempotency_key": args.idempotency_key or f"cli-{uuid.uuid4()}",
    }
    if args.gang is not None:
        body["gang"] = args.gang
    if args.node_policy or args.card_policy:
        body["placement"] = {"node": args.node_policy, "card": args.card_policy}
    claim = client.post("/v1/claims", body)
    if args.wait is not None:
        return _created_and_ready(client, claim["id"], args.wait)
    return Shown(claim, _claims_table([claim]))


def _created_and_ready(client: Client, claim_id: str, timeout_s: float) -> Shown:
    """`create --wait`: a claim that is not ready in time was created all the same, and
    stays (pending, say) until deleted: the error says so and how."""
    try:
        return _until(client, claim_id, ClaimStatus.READY.value, timeout_s)
    except WaitFailed as exc:
        if exc.status in FINAL_STATUSES:
            raise
        left = f"the claim stays {exc.status}; `qshare claims delete {claim_id}` withdraws it"
        raise WaitFailed(f"{exc}\n{left}", exc.status) from exc


def _list_claims(client: Client, args: argparse.Namespace) -> Shown:
    page = client.get(
        "/v1/claims", status=args.status, priority=args.priority, node=args.node,
        tenant=args.tenant, limit=args.limit, cursor=args.cursor,
    )  # fmt: skip
    more = f"\n(more: --cursor {page['next_cursor']})" if page.get("next_cursor") else ""
    unknown = _unknown_node(client, args.node) if not page["items"] else ""
    return Shown(page, _claims_table(page["items"]) + more + unknown)


def _unknown_node(client: Client, node: str | None) -> str:
    """For an empty listing filtered by node: a line saying when no such node exists (a
    typo), since an empty table alone reads as 'nothing there'."""
    if node is None:
        return ""
    try:
        client.get(f"/v1/nodes/{segment(node)}")
    except ApiError as exc:
        if exc.status == 404:
            return f"\n(no node {node} is registered: `qshare nodes list` shows them)"
        raise
    return ""


def _get_claim(client: Client, args: argparse.Namespace) -> Shown:
    try:
        claim = client.get(f"/v1/claims/{args.claim_id}")
    except ApiError as exc:
        if exc.status != 404:
            raise
        hint = " (a released claim is listed by `qshare claims list --status released`)"
        raise ApiError(404, exc.problem | {"detail": f"{exc}{hint}"}) from exc
    reason = f"\nreason: {claim['reason']}" if claim.get("reason") else ""
    held = _suspension_line(claim)
    return Shown(claim, _claims_table([claim]) + reason + held + _vgpus_table(claim))


def _suspension_line(claim: dict[str, Any]) -> str:
    """For a suspended claim: by whom or what, since when, and what ends it."""
    held = claim.get("suspended")
    if not held:
        return ""
    if held["kind"] == "operator":
        who = f"{held['by']}, " if held.get("by") else ""
        until = (
            f"by an operator ({who}{held['reason']}): `qshare claims resume {claim['id']}` ends it"
        )
    else:
        until = f"for its gang ({held['reason']}): it runs again once no card of it is busy"
    return f"\nsuspended since {held['since']} {until}"


def _delete_claim(client: Client, args: argparse.Namespace) -> Shown:
    claim = client.delete(f"/v1/claims/{args.claim_id}")
    return Shown(claim, _claims_table([claim]))


def _resize_claim(client: Client, args: argparse.Namespace) -> Shown:
    change = {k: v for k, v in (("vcore", args.vcore), ("vmemory", args.vmemory)) if v is not None}
    if not change:
        raise UsageError("claims resize: give --vcore, --vmemory or both")
    claim = client.patch(f"/v1/claims/{args.claim_id}", change)
    return Shown(claim, _claims_table([claim]))


def _suspend_claim(client: Client, args: argparse.Namespace) -> Shown:
    return _claim_action(client.post(f"/v1/claims/{args.claim_id}/suspend", _why(args)))


def _resume_claim(client: Client, args: argparse.Namespace) -> Shown:
    return _claim_action(client.post(f"/v1/claims/{args.claim_id}/resume", _why(args)))


def _why(args: argparse.Namespace) -> dict[str, str]:
    return {} if args.reason is None else {"reason": args.reason}


def _reason(value: str) -> str:
    """A reason the API takes (the contracts' `Text`, loaded here: the CLI starts without
    pydantic), checked before anything is sent."""
    from pydantic import TypeAdapter, ValidationError

    from qshare.contracts.claims import Text

    try:
        return str(TypeAdapter(Text).validate_python(value))
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(cli_words(exc.errors()[0]["msg"])) from exc


def _claim_action(reply: dict[str, Any]) -> Shown:
    verb = "suspended" if reply["suspended"] else "resumed"
    missing = (
        f" ({reply['missing']} not reached: see the preemptor's log)" if reply["missing"] else ""
    )
    vgpus = f"{reply['vgpus']} vGPU" + ("" if reply["vgpus"] == 1 else "s")
    return Shown(reply, f"claim {reply['claim_id']} {verb} on {vgpus}{missing}")


def _wait_claim(client: Client, args: argparse.Namespace) -> Shown:
    return _until(client, args.claim_id, args.until, args.timeout)


def _until(client: Client, claim_id: str, status: str, timeout_s: float) -> Shown:
    """Poll the claim until it has `status`; a claim that can no longer get there (released
    or failed) or the timeout ends the wait with an error that gives its status and reason."""
    deadline = time.monotonic() + timeout_s
    while True:
        claim = _claim_or_gone(client, claim_id)
        if claim["status"] == status:
            return Shown(claim, _claims_table([claim]) if "tenant" in claim else claim["status"])
        if claim["status"] in FINAL_STATUSES or time.monotonic() >= deadline:
            why = f" ({claim['reason']})" if claim.get("reason") else ""
            final = claim["status"] in FINAL_STATUSES
            waited = "" if final else f", after waiting {timeout_s:g} s"
            message = f"claim {claim_id} is {claim['status']}{why}, not {status}{waited}"
            raise WaitFailed(message, claim["status"])
        time.sleep(WAIT_POLL_S)


def _claim_or_gone(client: Client, claim_id: str) -> dict[str, Any]:
    """The claim; one no longer found by id reads as released (as, once released, it is)."""
    try:
        claim: dict[str, Any] = client.get(f"/v1/claims/{claim_id}")
    except ApiError as exc:
        if exc.status != 404:
            raise
        return {"id": claim_id, "status": ClaimStatus.RELEASED.value, "reason": "not found"}
    return claim


def _vgpus_table(claim: dict[str, Any]) -> str:
    rows = [
        (v["id"], v["node"], v["index"], v["gpu"], f"{v['vcore']}%", format_mib(v["vmemory_mib"]))
        for v in claim.get("vgpus", [])
    ]
    return "\n\n" + table(("VGPU", "NODE", "IDX", "CARD", "VCORE", "VMEM"), rows) if rows else ""


def _cordon(client: Client, args: argparse.Namespace) -> Shown:
    node = client.patch(f"/v1/nodes/{segment(args.name)}", {"schedulable": args.schedulable})
    return Shown(node, _nodes_table([node]))


def _get_node(client: Client, args: argparse.Namespace) -> Shown:
    node = client.get(f"/v1/nodes/{segment(args.name)}")
    return Shown(node, _nodes_table([node]))


def _delete_node(client: Client, args: argparse.Namespace) -> Shown:
    path, what = f"/v1/nodes/{segment(args.name)}", f"node {args.name}"
    if args.card is not None:
        path, what = f"{path}/gpus/{segment(args.card)}", f"card {args.card} of {what}"
    failed = client.delete(path)["failed_claims"]
    claims = f"claims now failed: {', '.join(failed)}" if failed else "no claim held it"
    return Shown({"failed_claims": failed}, f"{what} removed; {claims}")


def _list_nodes(client: Client, args: argparse.Namespace) -> Shown:
    nodes = client.every("/v1/nodes")
    return Shown(nodes, _nodes_table(nodes))


def _nodes_table(nodes: list[dict[str, Any]]) -> str:
    rows = [
        (n["name"], _node_status(n), n["gpus"], format_mib(n["memory_mib"]),
         format_mib(n["free_mib"]), ",".join(f"{k}={v}" for k, v in sorted(n["labels"].items())))
        for n in nodes
    ]  # fmt: skip
    return table(("NAME", "STATUS", "GPUS", "MEMORY", "FREE", "LABELS"), rows)


def _node_status(node: dict[str, Any]) -> str:
    """`Ready`, or `Ready,SchedulingDisabled` for a cordoned node (as kubectl shows it)."""
    return str(node["status"]) + ("" if node["schedulable"] else ",SchedulingDisabled")


def _list_gpus(client: Client, args: argparse.Namespace) -> Shown:
    cards = client.every("/v1/gpus", node=args.node)
    rows = [
        (g["node"], g["index"], g["uuid"], g["model"], "yes" if g["healthy"] else "NO",
         f"{g['vgpus']}/{g['max_vgpus']}", format_mib(g["memory_mib"]), format_mib(g["free_mib"]),
         f"{g['core_high_free']}%", f"{g['core_low_free']}%")
        for g in cards
    ]  # fmt: skip
    unknown = _unknown_node(client, args.node) if not cards else ""
    return Shown(cards, table(GPU_COLUMNS, rows) + unknown)


def _claims_table(claims: list[dict[str, Any]]) -> str:
    rows = [
        (c["id"], c["tenant"], claim_status(c), c["priority"], f"{c['vcore']}%",
         format_mib(c["vmemory_mib"]), c["count"], c.get("node") or "-",
         ",".join(str(v["index"]) for v in c.get("vgpus", [])) or "-")
        for c in claims
    ]  # fmt: skip
    return table(CLAIM_COLUMNS, rows)


def claim_status(claim: dict[str, Any]) -> str:
    """`ready`, or `ready,suspended` while the control plane holds its vGPUs stopped (as a
    cordoned node shows `Ready,SchedulingDisabled`)."""
    return str(claim["status"]) + (",suspended" if claim.get("suspended") else "")


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces."""
    cells = [[str(h) for h in headers], *[[str(v) for v in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )
