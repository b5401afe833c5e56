"""The plot of `qshare bench gpu`: per scenario, what co-location costs high priority (HP p99
÷ the same HP alone) beside what low priority keeps (LP throughput ÷ the same LP alone), so
workloads of different speeds share one scale; each bar is labelled with its absolute value."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

HP_TARGET = 1.05  # issue 9: HP p99 at most 5 % over HP alone


def plot(result: dict[str, Any], out_dir: Path) -> str | None:
    """Write `gpu.png` into `out_dir`; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    names = list(result["scenarios"])
    rows = [result["scenarios"][n] for n in names]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 0.42 * len(names) + 1.8), sharey=True)
    ys = list(range(len(names)))[::-1]
    _panel(left, ys, rows, "hp_p99_ratio", "hp_p99_ms", "{:.2f} ms", "C1")
    left.axvline(HP_TARGET, color="black", ls="--", lw=0.8, label=f"target x{HP_TARGET:g}")
    left.set_xlabel("HP p99 ÷ HP alone (lower is better)")
    _panel(right, ys, rows, "lp_ratio", "lp_items_per_s", "{:.0f}/s", "C0")
    right.set_xlabel("LP throughput ÷ LP alone (higher is better)")
    for ax in (left, right):
        ax.axvline(1.0, color="grey", lw=0.8)
        ax.grid(axis="x", alpha=0.3)
    left.legend(fontsize=8, loc="lower right")
    left.set_yticks(ys, names, fontsize=8)
    fig.suptitle(
        f"qshare on {result['gpu']}: median of {_runs(rows)} runs (bars: min..max); "
        "labels: absolute medians"
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    path = out_dir / "gpu.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def _runs(rows: list[dict[str, Any]]) -> str:
    """How many runs each bar's median is of: one number, or the range where rows differ."""
    counts = sorted({int(r.get("runs", 1)) for r in rows}) or [1]
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"


def axis_limit(values: list[float]) -> float:
    """An axis end that the bulk of the values sets: 1.3 x the 80th percentile, at least the
    median's double, so one or two outliers do not squash the rest."""
    if not values:
        return 1.0
    ordered = sorted(values)
    p80 = ordered[min(len(ordered) - 1, round(0.8 * (len(ordered) - 1)))]
    return max(1.3 * p80, 2 * statistics.median(ordered), 1e-9)


def _panel(
    ax: Any,
    ys: list[int],
    rows: list[dict[str, Any]],
    key: str,
    absolute: str,
    fmt: str,
    color: str,
) -> None:
    """One bar per row that has `key`, its spread as an error bar, its absolute value beside."""
    limit = axis_limit([float(r[key]) for r in rows if key in r])
    for y, r in zip(ys, rows, strict=True):
        if key not in r:
            continue
        value = float(r[key])
        ax.barh(y, min(value, limit), 0.7, color=color)
        end = min(value, limit)
        spread = _ratio_spread(r, key, absolute)
        if spread is not None and value <= limit:
            lo, hi = spread
            end = min(max(hi, value), limit)
            err = [[max(value - lo, 0.0)], [max(end - value, 0.0)]]  # rounding: never < 0
            ax.errorbar(value, y, xerr=err, fmt="none", ecolor="black", capsize=2, lw=0.8)
        label = fmt.format(float(r[absolute])) + (f"  (x{value:.2f})" if value > limit else "")
        ax.text(end + 0.01 * limit, y, label, va="center", fontsize=7)
    ax.set_xlim(0, limit * 1.3)


def _ratio_spread(r: dict[str, Any], key: str, absolute: str) -> tuple[float, float] | None:
    """The absolute figure's min..max, scaled as the ratio scales the median."""
    spread = r.get(f"{absolute}_spread")
    if not spread or not r.get(absolute):
        return None
    scale = float(r[key]) / float(r[absolute])
    return float(spread[0]) * scale, float(spread[1]) * scale
