"""What failed authentications may cost: they are counted per client address, and an address
that has spent its allowance gets a 429 before any database lookup. A token this process has
recently seen valid is looked up whatever its address has spent, so a caller with a good
token keeps working beside a neighbour (behind the same NAT or proxy) guessing bad ones."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from starlette.types import Scope

from qshare_api.addresses import IpNetwork, client_address
from qshare_api.ratelimit import RateLimiter

KNOWN_LIMIT = 65_536
"""Valid token hashes remembered at most; beyond that the one used longest ago is forgotten."""


class FailedAuth:
    """`rate` failed authentications per second per client address, bursts of `burst`."""

    def __init__(self, rate: float, burst: int, trusted: Sequence[IpNetwork]) -> None:
        what = "failed authentications/s (unknown, revoked or expired tokens) from this address"
        self.limiter = RateLimiter(rate, burst, what)
        self.trusted = tuple(trusted)
        self._known: OrderedDict[str, None] = OrderedDict()

    def address(self, scope: Scope) -> str:
        return client_address(scope, self.trusted)

    def before_lookup(self, digest: str, address: str) -> bool:
        """Let the lookup of `digest` go on, or raise TooFast (a 429). A token not known valid
        reserves one failure of its address first: True, given back if it proves valid."""
        if digest in self._known:
            self._known.move_to_end(digest)
            return False
        self.limiter.take(address)
        return True

    def succeeded(self, digest: str, address: str, reserved: bool) -> None:
        if reserved:
            self.limiter.give_back(address)
        self._known[digest] = None
        self._known.move_to_end(digest)
        while len(self._known) > KNOWN_LIMIT:
            self._known.popitem(last=False)

    def failed(self, digest: str, address: str, reserved: bool) -> None:
        """A token revoked or expired since it was known valid counts as a failure too."""
        self._known.pop(digest, None)
        if not reserved:
            self.limiter.spend(address)
