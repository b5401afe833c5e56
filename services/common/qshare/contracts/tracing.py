"""OpenTelemetry set-up and W3C trace-context propagation through NATS headers. Spans leave
the process over OTLP/HTTP when the standard `OTEL_EXPORTER_OTLP_ENDPOINT` (or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, as every OpenTelemetry SDK does; the service
name and the sampler follow `OTEL_SERVICE_NAME` and `OTEL_TRACES_SAMPLER[_ARG]`."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal

from opentelemetry import context, propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
)
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    DEFAULT_OFF,
    DEFAULT_ON,
    ParentBasedTraceIdRatio,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import Link, Span, SpanContext, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from pydantic import AnyHttpUrl, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from qshare.envsettings import SettingsError, load

log = logging.getLogger(__name__)
_added: set[str] = set()
"""The exporters this process already sends spans to (set-up is called once per service, and
several services may share a process)."""


_FIXED: dict[str, Sampler] = {
    "always_on": ALWAYS_ON,
    "always_off": ALWAYS_OFF,
    "parentbased_always_on": DEFAULT_ON,
    "parentbased_always_off": DEFAULT_OFF,
}
_RATIO = {"traceidratio": TraceIdRatioBased, "parentbased_traceidratio": ParentBasedTraceIdRatio}


class OtlpSettings(BaseSettings):
    """The standard OpenTelemetry variables qshare reads itself; the exporter reads the rest
    (`OTEL_EXPORTER_OTLP_HEADERS`, `..._TIMEOUT`, `..._CERTIFICATE`)."""

    model_config = SettingsConfigDict(env_prefix="OTEL_", extra="ignore")

    sdk_disabled: bool = Field(False, description="true: no traces at all")
    traces_exporter: Literal["otlp", "console", "none"] = Field(
        "otlp", description="where spans go: the OTLP endpoint, the console, or nowhere"
    )
    exporter_otlp_endpoint: AnyHttpUrl | None = Field(
        None, description="OTLP/HTTP collector; spans go to its /v1/traces (unset: none sent)"
    )
    exporter_otlp_traces_endpoint: AnyHttpUrl | None = Field(
        None, description="the traces URL itself, instead of the endpoint's /v1/traces"
    )
    exporter_otlp_protocol: Literal["http/protobuf"] = Field(
        "http/protobuf", description="the one protocol qshare ships an exporter for"
    )
    service_name: str = Field("", description="the spans' service.name; empty: qshare's own")
    traces_sampler: str = Field(
        "parentbased_always_on", description="which traces are kept (the SDK's names, any case)"
    )
    traces_sampler_arg: float = Field(
        1.0, ge=0.0, le=1.0, description="the share of traces the *traceidratio samplers keep"
    )

    @field_validator("traces_sampler")
    @classmethod
    def _known_sampler(cls, value: str) -> str:
        """One of the SDK's samplers, in any case (as the SDK reads it)."""
        if value.lower() not in _FIXED.keys() | _RATIO.keys():
            raise ValueError(f"should be one of {', '.join([*_FIXED, *_RATIO])}")
        return value.lower()

    @property
    def sampler(self) -> Sampler:
        ratio = _RATIO.get(self.traces_sampler)
        return _FIXED[self.traces_sampler] if ratio is None else ratio(self.traces_sampler_arg)

    @property
    def endpoint(self) -> str | None:
        """Where spans go; None when export is off."""
        if self.sdk_disabled or self.traces_exporter != "otlp":
            return None
        if self.exporter_otlp_traces_endpoint is not None:
            return str(self.exporter_otlp_traces_endpoint)
        base = self.exporter_otlp_endpoint
        return None if base is None else str(base).rstrip("/") + "/v1/traces"


class TracingConfigError(SettingsError):
    """`OTEL_*` variables qshare cannot use; each problem names its variable."""


def otlp_settings() -> OtlpSettings:
    try:
        return load(OtlpSettings)
    except SettingsError as exc:
        raise TracingConfigError(exc.problems) from None


def setup_tracing(service: str, console: bool = False) -> None:
    """Install an SDK tracer provider once per process and the exporters the settings ask
    for: OTLP/HTTP when an endpoint is set, the console when `console`. `service` names the
    spans' service unless `OTEL_SERVICE_NAME` does. An invalid `OTEL_*` variable raises
    TracingConfigError naming it."""
    settings = otlp_settings()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        resource = Resource.create({"service.name": settings.service_name or service})
        provider = TracerProvider(sampler=settings.sampler, resource=resource)
        trace.set_tracer_provider(provider)
    if console or settings.traces_exporter == "console":
        _add(provider, "console", lambda: SimpleSpanProcessor(ConsoleSpanExporter()))
    if (endpoint := settings.endpoint) is not None:
        _add(provider, endpoint, lambda: _otlp(endpoint))


def _add(provider: TracerProvider, key: str, make: Callable[[], SpanProcessor]) -> None:
    if key in _added:
        return
    provider.add_span_processor(make())
    _added.add(key)
    log.info("traces go to %s", key)


def _otlp(endpoint: str) -> SpanProcessor:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint), schedule_delay_millis=1000)


def flush_tracing(timeout_s: float = 2.0) -> None:
    """Send the spans still batched (a service calls it as it stops)."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        provider.force_flush(int(timeout_s * 1000))


def handling(
    scope: str, subject: str, headers: dict[str, str] | None, kind: SpanKind = SpanKind.SERVER
) -> AbstractContextManager[Span]:
    """The span of handling one NATS message, child of the trace its headers carry (a root
    span when they carry none)."""
    return _tracer(scope).start_as_current_span(subject, extract_context(headers), kind)


@functools.cache
def _tracer(scope: str) -> trace.Tracer:
    """One tracer per scope, not one per message. Before `setup_tracing` it is the API's
    proxy, which turns to the provider installed later."""
    return trace.get_tracer(scope)


def inject_headers(headers: dict[str, str] | None = None) -> dict[str, str]:
    """Headers carrying the current span as `traceparent` (and `tracestate`)."""
    carrier = dict(headers or {})
    propagate.inject(carrier)
    return carrier


def extract_context(headers: dict[str, str] | None) -> context.Context:
    """The remote parent context carried by a message's headers, if any."""
    return propagate.extract(headers or {})


_W3C = TraceContextTextMapPropagator()
W3C_KEYS = ("traceparent", "tracestate")


def current_trace_context() -> dict[str, str] | None:
    """The current span's W3C headers (`traceparent`, and `tracestate` if any), to store
    with what this request creates; None outside any span."""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    return carrier or None


def stored_context(stored: Any, what: str) -> context.Context | None:
    """The trace context `current_trace_context` stored; None when there is none, and, with
    a log line naming `what`, when the stored value is not one (it is never trusted)."""
    if stored is None:
        return None
    if not isinstance(stored, dict) or not isinstance(stored.get("traceparent"), str):
        log.warning("%s: stored trace context %.200r is not W3C headers; ignored", what, stored)
        return None
    carrier = {k: v for k, v in stored.items() if k in W3C_KEYS and isinstance(v, str)}
    found = _W3C.extract(carrier)
    if not trace.get_current_span(found).get_span_context().is_valid:
        log.warning("%s: stored traceparent %.200r is not valid; ignored", what, carrier)
        return None
    return found


def span_context(stored: context.Context | None) -> SpanContext | None:
    """The span a context holds, when it holds a valid one."""
    held = trace.get_current_span(stored).get_span_context()
    return held if held.is_valid else None


def later_span(
    scope: str,
    name: str,
    parent: context.Context | None,
    *,
    links: Sequence[SpanContext] = (),
    start_time: int | None = None,
    attributes: dict[str, str] | None = None,
) -> AbstractContextManager[Span]:
    """The span of work done later on an earlier request's behalf (a pending claim placed
    by the sweep): a child of the context stored from that request, or of the current one
    when `parent` is None; `links` name other spans it also acts for."""
    return _tracer(scope).start_as_current_span(
        name, parent, SpanKind.INTERNAL, attributes=attributes,
        links=[Link(each) for each in links], start_time=start_time,
    )  # fmt: skip


@contextlib.contextmanager
def attached(held: context.Context | None) -> Iterator[None]:
    """Run the block in `held` (the tasks it starts copy it); as is when None."""
    if held is None:
        yield
        return
    token = context.attach(held)
    try:
        yield
    finally:
        context.detach(token)
