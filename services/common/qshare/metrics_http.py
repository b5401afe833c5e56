"""A service's Prometheus `/metrics` endpoint that stops with the service: the process-wide
counters, and collectors of the service's own, on a registry of its own, so that several
services in one process (or one started again) each serve theirs and free their port."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import REGISTRY, CollectorRegistry, Metric, start_http_server
from prometheus_client.registry import Collector
from pydantic import BaseModel, Field

from qshare.envsettings import env_names
from qshare.health import ListenError


class MetricsSettings(BaseModel):
    """The metrics server's fields of a service's settings (with the service's env prefix)."""

    metrics_port: int = Field(
        0, ge=0, le=65535, description="serve Prometheus /metrics on this port; 0 = off"
    )
    metrics_host: str = Field(
        "127.0.0.1", description="address the metrics server binds (0.0.0.0 in containers)"
    )


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


def serve_metrics(settings: MetricsSettings, *own: Collector) -> MetricsServer | None:
    """The metrics server of `settings` started, or None when its port is 0 (off); a port it
    cannot listen on is a ListenError naming the setting."""
    port, host = settings.metrics_port, settings.metrics_host
    if not port:
        return None
    try:
        return MetricsServer(port, host, *own)
    except OSError as exc:
        setting = env_names(type(settings), "metrics_port")[0]  # type: ignore[arg-type]
        raise ListenError(
            f"{setting}={port}: the metrics server cannot listen on {host}:{port} "
            f"({exc.strerror or exc})"
        ) from exc
