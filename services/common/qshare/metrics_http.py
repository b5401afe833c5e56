"""A service's Prometheus `/metrics` endpoint that stops with the service: the process-wide
counters, and collectors of the service's own, on a registry of its own, so that several
services in one process (or one started again) each serve theirs and free their port."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import REGISTRY, CollectorRegistry, Metric, start_http_server
from prometheus_client.registry import Collector


class _ProcessWide(Collector):
    """The metrics registered globally (module-level counters and histograms)."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


class MetricsServer:
    """`/metrics` on `host:port` in a thread until `stop()`."""

    def __init__(self, port: int, host: str, *own: Collector) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        for collector in (_ProcessWide(), *own):
            self.registry.register(collector)
        self._server, self._thread = start_http_server(port, host, registry=self.registry)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
