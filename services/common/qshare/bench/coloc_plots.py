"""Figures of the co-location benchmark (matplotlib, Agg): a one-second timeline of the
bursty scenario, like the sequence diagram of the seeds, and HP p99 inflation against LP
harvest across release delays."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def plot_timeline(timelines: dict[str, dict[str, Any]], path: Path) -> Path:
    """One panel per mode: HP requests, the gate closed to LP, each LP process's kernels
    (running) and the time it was held at launch (suspended)."""
    modes = sorted(timelines)
    fig, axes = plt.subplots(len(modes), 1, figsize=(11, 1.2 + 1.4 * len(modes)), squeeze=False)
    for ax, mode in zip(axes[:, 0], modes, strict=True):
        tl = timelines[mode]
        n_lp = len(tl["lp"])
        labels = ["HP requests", "HP holds card"] + [f"LP {i + 1}" for i in range(n_lp)]
        y = {name: len(labels) - 1 - i for i, name in enumerate(labels)}
        ax.broken_barh(
            [(a, b - a) for a, b in tl["hp_requests"]],
            (y["HP requests"] - 0.4, 0.8),
            color="tab:red",
        )
        ax.broken_barh(
            [(a, b - a) for a, b in tl["gate_closed"]],
            (y["HP holds card"] - 0.4, 0.8),
            color="salmon",
        )
        for i, kernels in enumerate(tl["lp"]):
            row = y[f"LP {i + 1}"]
            held = [(s, u - s) for s, u, _ in kernels if u is not None and u > s]
            ran = [
                ((u if u is not None else s), e - (u if u is not None else s))
                for s, u, e in kernels
            ]
            ax.broken_barh(held, (row - 0.4, 0.8), color="lightgrey")
            ax.broken_barh(ran, (row - 0.4, 0.8), color="tab:blue")
        ax.set_yticks(list(y.values()), list(y.keys()))
        ax.set_xlim(0, tl["window_ms"])
        ax.set_title(f"{mode}: red = HP, blue = LP running, grey = LP suspended", fontsize=9)
    axes[-1, 0].set_xlabel("ms")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _limit(values: list[float]) -> float:
    """An x-axis end the bulk sets (1.3 x the 75th percentile, at least 1.5), not outliers."""
    ordered = sorted(values)
    p75 = ordered[min(len(ordered) - 1, round(0.75 * (len(ordered) - 1)))] if ordered else 1.0
    return max(1.5, 1.3 * p75)


SHAPE_ORDER = ("steady", "bursty", "eager")  # the graph HP's shapes, then the host-bound HP
MODE_ORDER = ("time-slicing", "qshare-0ms", "qshare-1ms", "qshare-1ms-dg", "qshare-10ms",
              "qshare-100ms", "qshare-100ms-dg", "qshare-auto")  # fmt: skip


def _cases(points: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(LP workload, mode) rows, grouped by workload, modes from plain co-location to qshare's
    longest release, each once."""
    rank = {m: i for i, m in enumerate(MODE_ORDER)}
    found = {(r["lp"], r["mode"]) for r in points}
    return sorted(found, key=lambda c: (c[0], rank.get(c[1], len(rank)), c[1]))


def _bars(ax: Any, values: list[float | None], top: float, fmt: str, color: str) -> None:
    """Horizontal bars clipped at `top`; each labelled with its value (clipped ones with an
    arrow), so no point hides another and no outlier sets the scale."""
    for y, v in enumerate(values):
        if v is None:
            continue
        ax.barh(y, min(v, top), color=color, height=0.7)
        label = fmt.format(v) + (" ▸" if v > top else "")
        ax.text(min(v, top) + top * 0.01, y, label, va="center", fontsize=7)
    ax.set_xlim(0, top * 1.18)
    ax.grid(axis="x", alpha=0.3)


def plot_inflation(rows: list[dict[str, Any]], path: Path) -> Path:
    """Per HP shape, HP p99 (x HP alone) beside LP harvest (% of the card time HP left idle),
    one row per LP workload and mode, side by side: what high priority pays and what low
    priority gets, read across one line."""
    points = [r for r in rows if r.get("hp_p99_inflation") is not None and r["harvest"] is not None]
    found = {r["shape"] for r in points}
    shapes = [s for s in SHAPE_ORDER if s in found] + sorted(found - set(SHAPE_ORDER))
    shapes = shapes or ["steady"]
    cases = _cases(points)
    top = _limit([r["hp_p99_inflation"] for r in points])
    height = 1.6 + 0.26 * len(cases)
    fig, axes = plt.subplots(1, 2 * len(shapes), figsize=(4.2 * len(shapes) + 4, height),
                             sharey=True, squeeze=False)  # fmt: skip
    for k, shape in enumerate(shapes):
        by_case = {(r["lp"], r["mode"]): r for r in points if r["shape"] == shape}
        hp_ax, lp_ax = axes[0][2 * k], axes[0][2 * k + 1]
        inflation = [by_case[c]["hp_p99_inflation"] if c in by_case else None for c in cases]
        harvest = [100 * by_case[c]["harvest"] if c in by_case else None for c in cases]
        _bars(hp_ax, inflation, top, "{:.2f}x", "tab:orange")
        _bars(lp_ax, harvest, 100.0, "{:.0f} %", "tab:blue")
        hp_ax.axvline(1.05, color="grey", lw=0.8, ls="--")
        hp_ax.set_title(f"{shape} HP: p99 ÷ alone (dashed 1.05)", fontsize=9)
        lp_ax.set_title(f"{shape} HP: LP harvest %", fontsize=9)
    labels = [f"{lp.removeprefix('lp-')} · {mode.removeprefix('qshare-')}" for lp, mode in cases]
    axes[0][0].set_yticks(range(len(cases)), labels, fontsize=8)
    axes[0][0].invert_yaxis()
    for y in range(1, len(cases)):
        if cases[y][0] != cases[y - 1][0]:
            for ax in axes[0]:
                ax.axhline(y - 0.5, color="black", lw=0.6)
    fig.suptitle("HP latency paid and LP work harvested, per LP workload and mode "
                 "(▸: beyond the axis)", fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
