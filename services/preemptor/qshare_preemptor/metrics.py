"""Prometheus metrics of the preemptor: card events and node commands counted as they happen;
the claims it holds suspended and the resumes it still owes read from its state when scraped."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import Counter, Histogram, Metric
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

CARD_EVENTS = Counter(
    "qshare_preemptor_card_events_total",
    "busy and idle events handled, by outcome: handled, or refused (about another node's card)",
    ["kind", "outcome"],
)
COMMANDS = Counter(
    "qshare_preemptor_commands_total",
    "suspend and resume commands sent to node agents, by outcome: ok, or failed (no answer "
    "or an error; a failed resume is sent again)",
    ["verb", "outcome"],
)
COMMAND_SECONDS = Histogram(
    "qshare_preemptor_command_seconds",
    "a suspend or resume command's round trip to its node agent, answered or not",
    ["verb"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
STARVED = Counter("qshare_preemptor_starved_total", "low-priority claims found starved")


class StateCollector(Collector):
    """What the preemptor holds now, read at scrape time (0 before it has started)."""

    def __init__(self, held: Callable[[], int], owed: Callable[[], dict[str, int]]) -> None:
        self._held, self._owed = held, owed

    def collect(self) -> Iterator[Metric]:
        held = GaugeMetricFamily(
            "qshare_preemptor_claims_held",
            "low-priority claims suspended for their gang while a card of it is busy",
        )
        held.add_metric([], self._held())
        owed = GaugeMetricFamily(
            "qshare_preemptor_resumes_owed",
            "vGPUs whose resume has not reached their node yet (sent again every second)",
            labels=["node"],
        )
        for node, count in self._owed().items():
            owed.add_metric([node], count)
        yield from (held, owed)
