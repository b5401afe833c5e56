"""Prometheus metrics of the node agent: per card and vGPU figures are read from the driver
when scraped; counters of events and commands are kept as they happen."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, Metric
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

EVENTS = Counter("qshare_node_events_total", "driver events published", ["node", "kind"])
RING_DROPPED = Gauge("qshare_node_ring_dropped", "driver ring entries lost so far", ["node"])
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


def family(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def counter(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=labels)
