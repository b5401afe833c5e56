"""Percentiles and small summaries shared by the benchmarks."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def percentiles(
    values: Sequence[float], qs: Sequence[float], names: Sequence[str] | None = None
) -> dict[str, float]:
    """{"p50": ..., "p99": ...} rounded to 4 decimals."""
    keys = names or [f"p{q:g}".replace(".", "") for q in qs]
    return {k: round(percentile(values, q), 4) for k, q in zip(keys, qs, strict=True)}
