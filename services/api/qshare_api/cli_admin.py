"""`qshare tokens|quotas …`: an administrator's command line over the REST API: issue, list
and revoke bearer tokens; set, list and clear tenants' quotas (and anyone's `quotas show`:
the caller's own quota and what it uses)."""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from qshare.contracts.domain import Role, TokenScope
from qshare.contracts.quantities import format_mib
from qshare_api.cli import Shown, UsageError, command, group, memory, named, table
from qshare_api.client import LOST, ApiError, Client, segment

if TYPE_CHECKING:
    from qshare_api.cli import Sub

T = TypeVar("T")
TOKEN_COLUMNS = ("ID", "NAME", "TENANT", "ROLE", "SCOPE", "CREATED", "EXPIRES")


def register(subparsers: Sub) -> None:
    tokens = group(subparsers, "tokens", "issue, list and revoke API tokens (admins)")
    create = tokens.add_parser("create", help="issue a token; its secret is shown only now")
    create.add_argument("--name", required=True, help="what the token is for")
    create.add_argument("--tenant", required=True, help="whose claims it acts on")
    create.add_argument(
        "--role", choices=[r.value for r in Role], default=Role.TENANT.value,
        help="admin: every tenant and the admin routes (default tenant)",
    )  # fmt: skip
    create.add_argument(
        "--scope", choices=[s.value for s in TokenScope], default="write",
        help="read: may only look (default write)",
    )  # fmt: skip
    create.add_argument(
        "--expires-in", type=int, metavar="SECONDS", help="seconds, 60 or more (default: never)"
    )
    create.set_defaults(handler=command(_issue_token))
    tokens.add_parser("list", help="list tokens, never their secrets").set_defaults(
        handler=command(_list_tokens)
    )
    revoke = tokens.add_parser("revoke", help="revoke a token at once")
    revoke.add_argument("token_id", type=_token_id, help="as `qshare tokens list` shows it")
    revoke.set_defaults(handler=command(_revoke_token))
    quotas = group(subparsers, "quotas", "tenants' limits: show yours; admins set them")
    show = quotas.add_parser("show", help="your quota and what your live claims use")
    show.add_argument("--tenant", help="another tenant's (admins)")
    show.set_defaults(handler=command(_show_quota))
    quotas.add_parser("list", help="list quotas (admins)").set_defaults(
        handler=command(_list_quotas)
    )
    put = quotas.add_parser(
        "set", help="change a tenant's limits: those given change, the others are kept; "
        "`none` removes a limit (admins)",
    )  # fmt: skip
    put.add_argument("tenant", type=named)
    put.add_argument(
        "--memory", type=_or_none(memory), default=argparse.SUPPRESS,
        help="memory its live claims may ask for: MiB or e.g. 64Gi; none: no limit",
    )  # fmt: skip
    put.add_argument(
        "--cards", type=_or_none(_count), default=argparse.SUPPRESS,
        help="vGPUs its live claims may hold; none: no limit",
    )  # fmt: skip
    put.add_argument(
        "--pending", type=_or_none(_count), default=argparse.SUPPRESS,
        help="claims it may have pending at once; none: no limit",
    )  # fmt: skip
    put.set_defaults(handler=command(_set_quota))
    clear = quotas.add_parser("clear", help="remove a tenant's quota (admins)")
    clear.add_argument("tenant", type=named)
    clear.set_defaults(handler=command(_clear_quota))


def _token_id(value: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a token id (a UUID, as `qshare tokens list` shows it)"
        ) from exc


def _issue_token(client: Client, args: argparse.Namespace) -> Shown:
    body = {"name": args.name, "tenant": args.tenant, "role": args.role, "scope": args.scope,
            "expires_in_s": args.expires_in}  # fmt: skip
    try:
        issued = client.post("/v1/tokens", body, again=False)
    except LOST as exc:
        raise UsageError(
            f"no answer came ({exc or type(exc).__name__}), so the token may have been issued "
            "without its secret reaching you: `qshare tokens list` shows it, `qshare tokens "
            "revoke ID` removes it; it was not asked for again"
        ) from exc
    text = f"{_tokens_table([issued])}\n\ntoken: {issued['token']}\n(shown only now: store it)"
    return Shown(issued, text)


def _list_tokens(client: Client, args: argparse.Namespace) -> Shown:
    tokens = client.every("/v1/tokens")
    return Shown(tokens, _tokens_table(tokens))


def _revoke_token(client: Client, args: argparse.Namespace) -> Shown:
    client.delete(f"/v1/tokens/{args.token_id}")
    return Shown({"id": args.token_id, "revoked": True}, f"token {args.token_id} revoked")


def _tokens_table(tokens: list[dict[str, Any]]) -> str:
    rows = [
        (t["id"], t["name"], t["tenant"], t["role"], t["scope"], day(t.get("created_at")),
         day(t.get("expires_at")) if t.get("expires_at") else "never")
        for t in tokens
    ]  # fmt: skip
    return table(TOKEN_COLUMNS, rows)


def day(stamp: str | None) -> str:
    """An ISO time to the minute, as a table shows it."""
    return (stamp or "-")[:16].replace("T", " ")


def _list_quotas(client: Client, args: argparse.Namespace) -> Shown:
    quotas = client.every("/v1/quotas")
    return Shown(quotas, _quotas_table(quotas))


def _show_quota(client: Client, args: argparse.Namespace) -> Shown:
    mine = client.get("/v1/me/quota", tenant=args.tenant)
    used = mine["usage"]
    rows = [
        _usage_row("memory", mine["memory_mib"], used["memory_mib"], format_mib),
        _usage_row("cards", mine["cards"], used["cards"], str),
        _usage_row("pending", mine["pending"], used["pending"], str),
    ]
    heading = f"tenant {mine['tenant']} (a limit of - is no limit)"
    return Shown(mine, heading + "\n" + table(("", "USED", "LIMIT"), rows))


def _usage_row(
    name: str, limit: int | None, used: int, shown: Callable[[int], str]
) -> tuple[str, str, str]:
    return (name, shown(used), "-" if limit is None else shown(limit))


LIMITS = ("memory", "cards", "pending")


def _set_quota(client: Client, args: argparse.Namespace) -> Shown:
    """PATCH: only the limits given change (a PUT would clear the ones left out)."""
    body = {name: getattr(args, name) for name in LIMITS if hasattr(args, name)}
    if not body:
        raise UsageError(
            "give at least one of --memory, --cards, --pending (`none` removes a limit)"
        )
    try:
        quota = client.patch(f"/v1/quotas/{segment(args.tenant)}", body)
    except ApiError as exc:
        if exc.status != 404 or any(v is not None for v in body.values()):
            raise
        raise ApiError(
            404, exc.problem | {"detail": _nothing_to_remove(args.tenant, body)}
        ) from exc
    return Shown(quota, _quotas_table([quota]))


def _nothing_to_remove(tenant: str, body: dict[str, Any]) -> str:
    """Where `quotas set T --cards none` finds no quota: said in the options typed (the API's
    404 speaks of a PATCH that sets no limit)."""
    given = ", ".join(f"--{name} none" for name in body)
    return (
        f"tenant {tenant} has no quota, so {given} has no limit to remove "
        f"(`qshare quotas set {tenant} --cards 8` sets one)"
    )


def _count(value: str) -> int:
    if not value.strip().isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number (0 or more) or none")
    return int(value)


def _or_none(parse: Callable[[str], T]) -> Callable[[str], T | None]:
    """`parse`, or None for `none` (no limit)."""

    def parsed(value: str) -> T | None:
        return None if value.strip().lower() == "none" else parse(value)

    parsed.__name__ = getattr(parse, "__name__", "value")  # argparse names it in errors
    return parsed


def _clear_quota(client: Client, args: argparse.Namespace) -> Shown:
    client.delete(f"/v1/quotas/{segment(args.tenant)}")
    return Shown({"tenant": args.tenant, "cleared": True}, f"quota of {args.tenant} cleared")


def _quotas_table(quotas: list[dict[str, Any]]) -> str:
    def limit(value: int | None, shown: str) -> str:
        return "-" if value is None else shown

    rows = [
        (q["tenant"], limit(q["memory_mib"], format_mib(q["memory_mib"] or 0)),
         limit(q["cards"], str(q["cards"])), limit(q["pending"], str(q["pending"])))
        for q in quotas
    ]  # fmt: skip
    return table(("TENANT", "MEMORY", "CARDS", "PENDING"), rows)
