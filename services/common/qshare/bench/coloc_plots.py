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
    """A y-axis end the bulk sets (1.3 x the 75th percentile, at least 1.5), not outliers."""
    ordered = sorted(values)
    p75 = ordered[min(len(ordered) - 1, round(0.75 * (len(ordered) - 1)))] if ordered else 1.0
    return max(1.5, 1.3 * p75)


def plot_inflation(rows: list[dict[str, Any]], path: Path) -> Path:
    """HP p99 inflation (x HP alone) against LP harvest, one panel per shape, one colour per
    LP workload; points above the axis (set by the bulk) sit on its edge with their value."""
    points = [r for r in rows if r.get("hp_p99_inflation") is not None and r["harvest"] is not None]
    shapes = sorted({r["shape"] for r in points}) or ["steady"]
    lps = sorted({r["lp"] for r in points})
    top = _limit([r["hp_p99_inflation"] for r in points])
    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 4.8), squeeze=False)
    for ax, shape in zip(axes[0], shapes, strict=True):
        for i, r in enumerate(r for r in points if r["shape"] == shape):
            y = min(r["hp_p99_inflation"], top)
            color = f"C{lps.index(r['lp'])}"
            ax.scatter(
                100 * r["harvest"], y, color=color, marker="^" if y < r["hp_p99_inflation"] else "o"
            )
            name = r["mode"].removeprefix("qshare-")
            if y < r["hp_p99_inflation"]:
                name += f" ({r['hp_p99_inflation']:.1f}x)"
            ax.annotate(
                name,
                (100 * r["harvest"], y),
                fontsize=7,
                color=color,
                xytext=(4, 6 - 12 * (i % 2)),
                textcoords="offset points",
            )
        ax.set_ylim(0.9, top * 1.05)
        ax.set_xlim(-2, 102)
        ax.axhline(1.05, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("LP harvest: % of the card time HP left idle")
        ax.set_title(f"{shape} HP (dashed: 1.05 x alone; ^ clipped)", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("HP p99 latency / HP alone")
    for i, lp in enumerate(lps):
        axes[0][-1].scatter([], [], color=f"C{i}", label=lp)
    axes[0][-1].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
