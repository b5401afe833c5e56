"""Small statistics for the co-location benchmark: percentiles, release latencies, windows."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (nearest rank) of `values`; 0.0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[rank - 1])


def ms(ns: float) -> float:
    return ns / 1e6


def release_latencies(unblocks: Sequence[int], hp_ends: Sequence[int]) -> list[int]:
    """For each time low priority resumed, how long after high priority's last completion."""
    out = []
    for u in unblocks:
        i = bisect.bisect_right(hp_ends, u)
        if i:
            out.append(u - hp_ends[i - 1])
    return out


def window_shares(
    samples: Sequence[tuple[int, Sequence[int]]], window_ns: int
) -> list[tuple[int, list[float]]]:
    """Shares of the card (device ns per wall ns) over every `window_ns` window that starts at
    one sample and ends at a later one: (window start, share per counter)."""
    out = []
    times = [t for t, _ in samples]
    for i, (t, counters) in enumerate(samples):
        j = bisect.bisect_left(times, t + window_ns, lo=i)
        if j >= len(samples):
            break
        t2, later = samples[j]
        out.append((t, [(b - a) / (t2 - t) for a, b in zip(counters, later, strict=True)]))
    return out
