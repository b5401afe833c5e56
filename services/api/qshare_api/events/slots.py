"""How many event streams each token may hold open at once in one API process: every stream
holds a NATS subscription and a queue of up to a thousand events, so a token that opened
streams without end (within its request rate) would exhaust the API's memory."""

from __future__ import annotations

from collections import Counter

from qshare.contracts.errors import RateLimited


class StreamSlots:
    """At most `per_token` open streams per token key; `take` one, `give_back` it once."""

    def __init__(self, per_token: int) -> None:
        self._per_token = per_token
        self._open: Counter[str] = Counter()

    def take(self, key: str) -> None:
        """Count one more open stream of `key`, or raise RateLimited (a 429) naming the cap."""
        if self._open[key] >= self._per_token:
            raise RateLimited(
                f"this token already has {self._per_token} event streams open (the most "
                "one token may hold at once); close one first"
            )
        self._open[key] += 1

    def give_back(self, key: str) -> None:
        self._open[key] -= 1
        if self._open[key] <= 0:
            del self._open[key]

    def open(self, key: str) -> int:
        """Streams `key` holds open now."""
        return self._open[key]
