"""Who is at the other end of a request, for limits counted per client address: the peer
itself, or, only where the peer is a proxy the settings trust, the address it forwarded."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from starlette.types import Scope

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
UNKNOWN = "unknown"
"""The key of a peer with no IP address (a Unix socket): all such callers share it."""


def client_address(scope: Scope, trusted: Sequence[IpNetwork]) -> str:
    """The key of the request's client: its IP address, an IPv6 one as its /64 (one host
    holds a whole /64, so counting each address would let it spread over 2^64 keys).
    `X-Forwarded-For` is read only while the address at hand is a trusted proxy, from the
    right (each proxy appends the address it saw), so a client cannot write its own."""
    client = scope.get("client")
    address = _ip(client[0]) if client else None
    if address is None:
        return UNKNOWN
    hops = _forwarded(scope) if trusted else []
    while hops and _within(address, trusted):
        hop = _ip(hops.pop())
        if hop is None:  # a trusted proxy wrote something else: count the proxy
            break
        address = hop
    return _key(address)


def _forwarded(scope: Scope) -> list[str]:
    values = [v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"x-forwarded-for"]
    return [hop.strip() for hop in ",".join(values).split(",") if hop.strip()]


def _ip(text: str) -> IpAddress | None:
    """An address as a peer or a proxy writes it: bare, `v4:port` or `[v6]:port`."""
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)  # `::ffff:10.0.0.1` is 10.0.0.1
    return address if mapped is None else mapped


def _within(address: IpAddress, trusted: Sequence[IpNetwork]) -> bool:
    return any(address.version == net.version and address in net for net in trusted)


def _key(address: IpAddress) -> str:
    if isinstance(address, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)
