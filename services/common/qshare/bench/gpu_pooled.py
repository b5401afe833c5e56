"""HP latency pooled over all of a scenario's runs in `qshare bench gpu` (every request, not
the median of each run's p99, which at 300 requests a run is its third-worst request), with
bootstrap confidence intervals, so that a target such as "p99 within 5 % of HP alone" gets a
verdict only where the requests measured can decide it: `met`, `missed` or `undecided`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from qshare.bench.stats import percentile

LATENCIES = "hp_latency_ms"
"""Each run's per-request latencies, kept in its raw record."""
RESAMPLES = 2000
LEVEL = 0.90
SEED = 9

Runs = Sequence[dict[str, Any]]
Interval = tuple[float, float]


def samples(runs: Runs) -> list[float]:
    """Every request of the runs that kept their latencies (older runs did not)."""
    return [float(x) for r in runs for x in r.get(LATENCIES, ())]


def p99(xs: Sequence[float]) -> float:
    return percentile(xs, 99)


def _draws(xs: Sequence[float], rng: Any) -> Any:
    """p99 of each of RESAMPLES bootstrap resamples of `xs` (numpy: thousands at once)."""
    import numpy as np

    values = np.asarray(xs, dtype=float)
    picks = rng.integers(0, len(values), size=(RESAMPLES, len(values)))
    return np.percentile(values[picks], 99, axis=1)  # linear, as stats.percentile


def _central(draws: Any) -> Interval:
    import numpy as np

    tail = 100 * (1 - LEVEL) / 2
    low, high = np.percentile(draws, [tail, 100 - tail])
    return float(low), float(high)


def _rng() -> Any:
    import numpy as np

    return np.random.default_rng(SEED)


def p99_interval(xs: Sequence[float]) -> Interval:
    return _central(_draws(xs, _rng()))


def ratio_interval(xs: Sequence[float], base: Sequence[float]) -> Interval:
    """p99(xs) ÷ p99(base), both resampled."""
    rng = _rng()
    return _central(_draws(xs, rng) / _draws(base, rng))


def added_interval(xs: Sequence[float], base: Sequence[float]) -> Interval:
    """p99(xs) − p99(base), both resampled."""
    rng = _rng()
    return _central(_draws(xs, rng) - _draws(base, rng))


def verdict(bounds: Interval | None, limit: float) -> str | None:
    """`met` when the whole interval is at or under `limit`, `missed` when it is all above,
    `undecided` when it straddles it; None without an interval."""
    if bounds is None:
        return None
    low, high = bounds
    return "met" if high <= limit else "missed" if low > limit else "undecided"


def pooled(runs: Runs) -> dict[str, Any]:
    """The scenario's pooled HP figures; empty when no run kept its latencies."""
    xs = samples(runs)
    if not xs:
        return {}
    return {
        "hp_samples": len(xs),
        "hp_p50_pooled_ms": percentile(xs, 50),
        "hp_p99_pooled_ms": p99(xs),
        "hp_p99_pooled_ci90": list(p99_interval(xs)),
    }


def against_alone(runs: Runs, alone: Runs) -> dict[str, Any]:
    """The pooled p99 beside HP alone's: ratio and added, each with its interval."""
    xs, base = samples(runs), samples(alone)
    if not xs or not base:
        return {}
    return {
        "hp_p99_pooled_ratio": p99(xs) / p99(base),
        "hp_p99_pooled_ratio_ci90": list(ratio_interval(xs, base)),
        "hp_p99_pooled_added_ms": p99(xs) - p99(base),
        "hp_p99_pooled_added_ms_ci90": list(added_interval(xs, base)),
    }


def within(runs: Runs, base: Runs, limit: float) -> str | None:
    """Whether p99(runs) ÷ p99(base) is at most `limit`, as far as the requests can say."""
    xs, ys = samples(runs), samples(base)
    return verdict(ratio_interval(xs, ys), limit) if xs and ys else None


Rows = dict[str, dict[str, Any]]


def targets(scenarios: Rows, raw: Mapping[str, Runs], gpt2_kernel_ms: float) -> dict[str, Any]:
    """Issue 9's HP latency targets judged on the pooled requests: the graph HP's rows read
    the intervals their scenarios already hold against HP alone (`against_alone`); only the
    eager `auto` row is set against another co-located row here. None where a scenario or
    its latencies are missing."""

    def beside_alone(name: str, key: str) -> Interval | None:
        bounds = scenarios.get(name, {}).get(key)
        return None if bounds is None else (bounds[0], bounds[1])

    ratio, added = "hp_p99_pooled_ratio_ci90", "hp_p99_pooled_added_ms_ci90"
    return {
        "graph_1ms_hp_p99": verdict(beside_alone("graph+lp_qshare_1ms", ratio), 1.05),
        "graph_100ms_hp_p99": verdict(beside_alone("graph+lp_qshare_100ms", ratio), 1.05),
        "gpt2_hp_p99": verdict(beside_alone("graph+gpt2_qshare_1ms", added), gpt2_kernel_ms),
        "eager_auto_hp_p99": within(
            raw.get("eager+lp_qshare_auto", []), raw.get("eager+lp_qshare_100ms", []), 1.0
        ),
    }
