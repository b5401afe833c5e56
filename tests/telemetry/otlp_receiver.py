"""A test double of an OpenTelemetry collector: it speaks OTLP/HTTP (POST /v1/traces with a
protobuf ExportTraceServiceRequest, answered with an empty ExportTraceServiceResponse), as
a real collector does, and keeps the spans it received for the test to read."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    service: str  # the resource's service.name
    scope: str  # the instrumentation scope (tracer) name
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, object]
    links: tuple[tuple[str, str], ...] = ()  # (trace id, span id) of each span it links


class OtlpReceiver:
    """`with OtlpReceiver() as r:` serves on `r.url` until the block ends."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> OtlpReceiver:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def wait_for(
        self, predicate: Callable[[list[ReceivedSpan]], bool], within_s: float = 20.0
    ) -> list[ReceivedSpan]:
        """The spans once `predicate(spans)` holds; the spans so far when it never does."""
        deadline = time.monotonic() + within_s
        while True:
            with self._lock:
                spans = list(self.spans)
            if predicate(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.1)

    def _keep(self, request: ExportTraceServiceRequest) -> None:
        found = [
            _span(resource_spans, scope_spans.scope.name, span)
            for resource_spans in request.resource_spans
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
        ]
        with self._lock:
            self.spans.extend(found)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path != "/v1/traces" or "protobuf" not in self.headers.get(
                    "Content-Type", ""
                ):
                    self.send_error(404 if self.path != "/v1/traces" else 415)
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._keep(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        return Handler


def _span(resource_spans: object, scope: str, span: object) -> ReceivedSpan:
    attributes = {
        kv.key: getattr(kv.value, kv.value.WhichOneof("value"))  # type: ignore[attr-defined]
        for kv in span.attributes  # type: ignore[attr-defined]
    }
    resource = {
        kv.key: kv.value.string_value
        for kv in resource_spans.resource.attributes  # type: ignore[attr-defined]
    }
    return ReceivedSpan(
        service=resource.get("service.name", ""), scope=scope, name=span.name,  # type: ignore[attr-defined]
        kind=span.kind, trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),  # type: ignore[attr-defined]
        parent_id=span.parent_span_id.hex(), attributes=attributes,  # type: ignore[attr-defined]
        links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),  # type: ignore[attr-defined]
    )  # fmt: skip
