"""Prometheus metrics of the node agent: per card and vGPU figures are read from the driver
when scraped; counters of events and commands are kept as they happen."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, Metric
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

EVENTS = Counter("qshare_node_events_total", "driver events published", ["node", "kind"])
PUMP_FAILURES = Counter(
    "qshare_node_event_pump_failures_total",
    "event pump failures survived, by stage: read (the driver ring), listener, publish",
    ["node", "stage"],
)
CHECKPOINTS_SET_ASIDE = Counter(
    "qshare_node_checkpoints_set_aside_total",
    "Kubernetes checkpoints found unusable at start, moved aside and rebuilt",
    ["node"],
)
APPLIES = Counter("qshare_node_applies_total", "cmd.apply handled", ["node", "outcome"])
APPLY_SECONDS = Histogram("qshare_node_apply_seconds", "time to converge one apply", ["node"])
TIMESLICE_SET = Gauge(
    "qshare_card_timeslice_set",
    "the card's timeslice (QSHARE_NODE_TIMESLICE) as the agent left it at start: 1 set to "
    "`level`, 0 refused (the agent's log says why); absent while the setting is `driver`",
    ["node", "gpu", "level"],
)
BUSY_SECONDS = Histogram(
    "qshare_node_preemption_seconds",
    "high-priority busy episodes: from busy to released (includes the release delay)",
    ["node", "gpu"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1, 5, 30),
)


class DriverCollector(Collector):
    """Reads card and vGPU figures from the driver at scrape time."""

    def __init__(self, agent: Any) -> None:
        self._agent = agent

    def collect(self) -> Iterator[Metric]:
        yield from self._agent.metric_families()


@dataclass(frozen=True)
class Figure:
    """One figure read from the driver's stats at scrape time."""

    name: str
    doc: str
    read: Callable[[Any], float]
    counter: bool = False


VGPU_LABELS = ["node", "vgpu", "claim", "gpu", "priority"]
VGPU_FIGURES = [
    Figure("qshare_vgpu_memory_used_bytes", "memory reserved", lambda s: s.mem_used),
    Figure("qshare_vgpu_memory_limit_bytes", "memory limit", lambda s: s.mem_limit),
    Figure("qshare_vgpu_core_share_percent", "compute share", lambda s: s.core_share),
    Figure(
        "qshare_vgpu_device_seconds", "device time used", lambda s: s.device_ns / 1e9, counter=True
    ),
    Figure("qshare_vgpu_launches", "kernel launches", lambda s: s.launches, counter=True),
    Figure("qshare_vgpu_processes", "processes attached", lambda s: s.contexts),
    Figure("qshare_vgpu_suspended", "1 while suspended", lambda s: int(s.suspended)),
]
CARD_LABELS = ["node", "gpu"]
CARD_FIGURES = [
    Figure("qshare_card_busy_episodes", "busy episodes", lambda s: s.episodes, counter=True),
    Figure("qshare_card_busy", "1 while high priority holds the card", lambda s: int(s.busy)),
    Figure("qshare_card_lp_window_seconds", "LP in-flight window", lambda s: s.lp_window_s),
    Figure("qshare_card_vgpus", "vGPUs on the card", lambda s: s.vgpus),
    Figure("qshare_card_memory_bytes", "the card's memory", lambda s: s.total_mem),
    Figure(
        "qshare_card_policy_wakes",
        "times low priority's completions woke the sharing policy's sleepers",
        lambda s: s.policy_wakes,
        counter=True,
    ),
]
# Read from the card's release mode (Node.release_auto), beside its stats.
RELEASE_FIGURES = [
    Figure(
        "qshare_card_release_delay_seconds",
        "release delay in force: the one auto release chose, else the fixed one",
        lambda a: a.delay_s,
    ),
    Figure(
        "qshare_card_release_auto",
        "1 while the driver chooses the release delay",
        lambda a: int(a.enabled),
    ),
]
NODE_LABELS = ["node"]
NODE_FIGURES = [
    Figure(
        "qshare_node_ring_dropped",
        "driver ring entries lost so far",
        lambda n: n.dropped_events,
        counter=True,
    ),
]

# Every table read from the driver at scrape time, with its labels (one row per vGPU, card, node).
SCRAPED = [
    (VGPU_FIGURES, VGPU_LABELS),
    (CARD_FIGURES, CARD_LABELS),
    (RELEASE_FIGURES, CARD_LABELS),
    (NODE_FIGURES, NODE_LABELS),
]


def families(
    figures: list[Figure], labels: list[str], rows: list[tuple[list[str], Any]]
) -> Iterator[Metric]:
    """One metric family per figure, a sample per (label values, stats) row."""
    for figure in figures:
        kind = CounterMetricFamily if figure.counter else GaugeMetricFamily
        metric = kind(figure.name, figure.doc, labels=labels)
        for values, stats in rows:
            metric.add_metric(values, figure.read(stats))
        yield metric
