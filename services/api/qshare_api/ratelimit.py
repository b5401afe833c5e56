"""Per-token request rate limit of one API process: a token bucket per caller; an empty
bucket answers 429 with `Retry-After`."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from qshare.contracts.errors import RateLimited

MAX_CALLERS = 100_000
"""Buckets kept at most; beyond that the fullest (idle) ones are forgotten."""


@dataclass
class _Bucket:
    tokens: float
    at: float = field(default_factory=time.monotonic)


class RateLimiter:
    """`rate` requests per second on average, bursts of up to `burst`, per caller key."""

    def __init__(self, rate: float, burst: int) -> None:
        self._rate = rate
        self._burst = burst
        self._buckets: dict[str, _Bucket] = {}

    def take(self, key: str) -> None:
        """Spend one request of `key`'s allowance, or raise RateLimited."""
        now = time.monotonic()
        bucket = self._buckets.get(key) or self._new(key)
        bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.at) * self._rate)
        bucket.at = now
        if bucket.tokens < 1:
            wait = math.ceil((1 - bucket.tokens) / self._rate)
            raise RateLimited(f"more than {self._rate:g} requests/s; retry in {wait} s")
        bucket.tokens -= 1

    def _new(self, key: str) -> _Bucket:
        if len(self._buckets) >= MAX_CALLERS:
            self._buckets.clear()
        bucket = self._buckets[key] = _Bucket(float(self._burst))
        return bucket
