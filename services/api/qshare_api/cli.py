"""`qshare claims|nodes|gpus …`: people's command line over the REST API, as readable tables."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import httpx

from qshare.contracts.quantities import format_mib
from qshare_api.client import ApiError, Client

if TYPE_CHECKING:
    Sub = argparse._SubParsersAction[argparse.ArgumentParser]

CLAIM_COLUMNS = ("ID", "TENANT", "STATUS", "PRIO", "VCORE", "VMEM", "COUNT", "NODE", "CARDS")


def register(subparsers: Sub) -> None:
    claims = _group(subparsers, "claims", "create, list, get and delete claims")
    create = claims.add_parser("create", help="ask for vGPUs")
    create.add_argument("--priority", required=True, choices=["high", "low"])
    create.add_argument("--vcore", required=True, type=int, help="core share per card, 1-100")
    create.add_argument("--vmemory", required=True, help="memory per card: MiB or e.g. 4Gi")
    create.add_argument("--count", type=int, default=1, help="cards, on one node")
    create.add_argument("--class", dest="class_name", default="qshare")
    create.add_argument("--selector", action="append", default=[], metavar="KEY=VALUE")
    create.add_argument("--node-policy", choices=["spread", "binpack"])
    create.add_argument("--card-policy", choices=["spread", "binpack"])
    create.add_argument("--idempotency-key")
    create.set_defaults(handler=_command(_create_claim))
    listing = claims.add_parser("list", help="list claims")
    listing.add_argument("--status")
    listing.add_argument("--priority")
    listing.add_argument("--node")
    listing.add_argument("--limit", type=int, default=50)
    listing.set_defaults(handler=_command(_list_claims))
    for verb, action in (("get", _get_claim), ("delete", _delete_claim)):
        one = claims.add_parser(verb, help=f"{verb} one claim")
        one.add_argument("claim_id")
        one.set_defaults(handler=_command(action))
    nodes = _group(subparsers, "nodes", "the inventory of nodes")
    nodes.add_parser("list", help="list nodes").set_defaults(handler=_command(_list_nodes))
    gpus = _group(subparsers, "gpus", "cards and their free capacity")
    gpu_list = gpus.add_parser("list", help="list cards")
    gpu_list.add_argument("--node")
    gpu_list.set_defaults(handler=_command(_list_gpus))


def _group(subparsers: Sub, name: str, help_: str) -> Sub:
    parser = subparsers.add_parser(name, help=help_)
    parser.add_argument("--url", default=os.environ.get("QSHARE_URL", "http://127.0.0.1:8080"))
    parser.add_argument("--token", default=os.environ.get("QSHARE_TOKEN"), help="or $QSHARE_TOKEN")
    return parser.add_subparsers(dest="action", required=True)


def _command(
    action: Callable[[Client, argparse.Namespace], str],
) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        try:
            print(action(Client(args.url, args.token), args))
        except ApiError as exc:
            print(f"error {exc.status}: {exc}", file=sys.stderr)
            for item in exc.problem.get("errors", []):
                print(f"  {item.get('field')}: {item.get('message')}", file=sys.stderr)
            return 1
        except httpx.HTTPError as exc:
            print(f"error: cannot reach the qshare API at {args.url}: {exc}", file=sys.stderr)
            return 2
        return 0

    return handler


def _create_claim(client: Client, args: argparse.Namespace) -> str:
    body: dict[str, Any] = {
        "priority": args.priority,
        "vcore": args.vcore,
        "vmemory": int(args.vmemory) if args.vmemory.isdigit() else args.vmemory,
        "count": args.count,
        "class_name": args.class_name,
        "node_selector": dict(s.split("=", 1) for s in args.selector if "=" in s),
    }
    if args.node_policy or args.card_policy:
        body["placement"] = {"node": args.node_policy, "card": args.card_policy}
    if args.idempotency_key:
        body["idempotency_key"] = args.idempotency_key
    return _claims_table([client.post("/v1/claims", body)])


def _list_claims(client: Client, args: argparse.Namespace) -> str:
    page = client.get(
        "/v1/claims", status=args.status, priority=args.priority, node=args.node, limit=args.limit
    )
    more = f"\n(more: --cursor {page['next_cursor']})" if page.get("next_cursor") else ""
    return _claims_table(page["items"]) + more


def _get_claim(client: Client, args: argparse.Namespace) -> str:
    claim = client.get(f"/v1/claims/{args.claim_id}")
    reason = f"\nreason: {claim['reason']}" if claim.get("reason") else ""
    return _claims_table([claim]) + reason


def _delete_claim(client: Client, args: argparse.Namespace) -> str:
    return _claims_table([client.delete(f"/v1/claims/{args.claim_id}")])


def _list_nodes(client: Client, args: argparse.Namespace) -> str:
    rows = [
        (n["name"], n["status"], n["gpus"], format_mib(n["memory_mib"]), format_mib(n["free_mib"]),
         ",".join(f"{k}={v}" for k, v in sorted(n["labels"].items())))
        for n in client.get("/v1/nodes")
    ]  # fmt: skip
    return table(("NAME", "STATUS", "GPUS", "MEMORY", "FREE", "LABELS"), rows)


def _list_gpus(client: Client, args: argparse.Namespace) -> str:
    rows = [
        (g["node"], g["index"], g["uuid"], g["model"], "yes" if g["healthy"] else "NO",
         f"{g['vgpus']}/{g['max_vgpus']}", format_mib(g["memory_mib"]), format_mib(g["free_mib"]),
         f"{g['core_high_free']}%", f"{g['core_low_free']}%")
        for g in client.get("/v1/gpus", node=args.node)
    ]  # fmt: skip
    headers = ("NODE", "IDX", "UUID", "MODEL", "HEALTHY", "VGPUS", "MEMORY", "FREE", "HIGH", "LOW")
    return table(headers, rows)


def _claims_table(claims: list[dict[str, Any]]) -> str:
    rows = [
        (c["id"], c["tenant"], c["status"], c["priority"], f"{c['vcore']}%",
         format_mib(c["vmemory_mib"]), c["count"], c.get("node") or "-",
         ",".join(str(v["index"]) for v in c.get("vgpus", [])) or "-")
        for c in claims
    ]  # fmt: skip
    return table(CLAIM_COLUMNS, rows)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces."""
    cells = [[str(h) for h in headers], *[[str(v) for v in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )
