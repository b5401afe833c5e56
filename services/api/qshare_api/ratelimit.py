"""Request rate limits of one API process: a token bucket per key (a token's hash, or a client
address for failed authentications); an empty bucket answers 429 with `Retry-After`."""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from dataclasses import dataclass

from qshare.contracts.errors import RateLimited

MAX_CALLERS = 100_000
"""Buckets kept at most; beyond that the one idle longest is forgotten (it has refilled the
most, so forgetting it changes the least)."""


class TooFast(RateLimited):
    """A 429 that says when to come back (`Retry-After`)."""

    def __init__(self, detail: str, retry_after_s: int) -> None:
        super().__init__(detail)
        self.retry_after_s = retry_after_s


@dataclass
class _Bucket:
    tokens: float
    at: float


class RateLimiter:
    """`rate` requests per second on average, bursts of up to `burst`, per caller key;
    `what` names what is counted, per second, in the 429's detail."""

    def __init__(self, rate: float, burst: int, what: str = "requests/s") -> None:
        self._rate = rate
        self._burst = burst
        self._what = what
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def take(self, key: str) -> None:
        """Spend one request of `key`'s allowance, or raise TooFast saying when to retry."""
        bucket = self._refilled(key)
        if bucket.tokens < 1:
            wait = max(1, math.ceil((1 - bucket.tokens) / self._rate))
            raise TooFast(f"more than {self._rate:g} {self._what}; retry in {wait} s", wait)
        bucket.tokens -= 1

    def spend(self, key: str) -> None:
        """Spend one of `key`'s allowance without refusing (down to empty, never below)."""
        bucket = self._refilled(key)
        bucket.tokens = max(0.0, bucket.tokens - 1)

    def give_back(self, key: str) -> None:
        """Return one taken in vain (the request turned out not to count)."""
        bucket = self._refilled(key)
        bucket.tokens = min(float(self._burst), bucket.tokens + 1)

    def __len__(self) -> int:
        return len(self._buckets)

    def _refilled(self, key: str) -> _Bucket:
        now = time.monotonic()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._new(key, now)
        self._buckets.move_to_end(key)
        bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.at) * self._rate)
        bucket.at = now
        return bucket

    def _new(self, key: str, now: float) -> _Bucket:
        """A full bucket as of `now` (made later, it would refill by a negative time)."""
        while len(self._buckets) >= MAX_CALLERS:
            self._buckets.popitem(last=False)
        bucket = self._buckets[key] = _Bucket(float(self._burst), now)
        return bucket
