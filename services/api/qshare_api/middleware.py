"""ASGI middleware: refuse oversized bodies before they are read; count and time requests."""

from __future__ import annotations

import json
import time

from prometheus_client import Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from qshare.contracts.errors import ErrorCode
from qshare_api.problems import PROBLEM_JSON, TYPE_BASE

REQUESTS = Counter("qshare_api_requests_total", "HTTP requests", ["method", "route", "status"])
LATENCY = Histogram(
    "qshare_api_request_seconds",
    "HTTP request latency",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)


class _TooLarge(Exception):
    pass


class BodyLimit:
    """Answers 422 with a problem document naming `body` when a body exceeds `limit` bytes."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(scope, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await self._refuse(scope, send)

    async def _refuse(self, scope: Scope, send: Send) -> None:
        code = ErrorCode.TOO_LARGE
        body = json.dumps(
            {
                "type": TYPE_BASE + code.value,
                "title": code.problem_title,
                "status": code.status,
                "detail": f"request body larger than {self.limit} bytes",
                "instance": scope["path"],
                "errors": [{"field": "body", "message": f"at most {self.limit} bytes"}],
            }
        ).encode()
        headers = [
            (b"content-type", PROBLEM_JSON.encode()),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": code.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
"""The methods counted by name; any other (a client may send any token) counts as `other`."""


class Metrics:
    """Counts requests by route template (not raw path) and known method (not whatever the
    client sent), to bound label cardinality."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def observed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, observed)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            method = scope["method"] if scope["method"] in METHODS else "other"
            REQUESTS.labels(method, route, str(status)).inc()
            LATENCY.labels(method, route).observe(time.perf_counter() - started)
