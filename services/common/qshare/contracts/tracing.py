"""OpenTelemetry set-up and W3C trace-context propagation through NATS headers."""

from __future__ import annotations

from opentelemetry import context, propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor


def setup_tracing(service: str, console: bool = False) -> None:
    """Install an SDK tracer provider once per process; spans go nowhere unless `console`."""
    if isinstance(trace.get_tracer_provider(), TracerProvider):
        return
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if console:
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    trace.set_tracer_provider(provider)


def inject_headers(headers: dict[str, str] | None = None) -> dict[str, str]:
    """Headers carrying the current span as `traceparent` (and `tracestate`)."""
    carrier = dict(headers or {})
    propagate.inject(carrier)
    return carrier


def extract_context(headers: dict[str, str] | None) -> context.Context:
    """The remote parent context carried by a message's headers, if any."""
    return propagate.extract(headers or {})
