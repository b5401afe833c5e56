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


def plot_inflation(rows: list[dict[str, Any]], path: Path) -> Path:
    """HP p99 inflation (x HP alone) against LP harvest, one point per mode and shape."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    markers = {"steady": "o", "bursty": "s"}
    for r in rows:
        if r.get("hp_p99_inflation") is None or r["harvest"] is None:
            continue
        ax.scatter(
            100 * r["harvest"],
            r["hp_p99_inflation"],
            marker=markers[r["shape"]],
            color="tab:orange" if r["mode"] == "time-slicing" else "tab:blue",
        )
        ax.annotate(
            f"{r['mode'].removeprefix('qshare-')} ({r['lp']})",
            (100 * r["harvest"], r["hp_p99_inflation"]),
            fontsize=6,
            xytext=(3, 3),
            textcoords="offset points",
        )
    ax.set_xlabel("LP harvest: % of the card time HP left idle")
    ax.set_ylabel("HP p99 latency / HP alone")
    ax.set_title("Release delay: HP p99 inflation vs LP harvest (o steady, s bursty)", fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
