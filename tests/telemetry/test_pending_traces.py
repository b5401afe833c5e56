"""The trace of a claim that waited for room: created before any node registered, it is
pending, and the allocator's sweep places it once the node agent is up. Its placement, the
apply to the node and its `placed` and `ready` events stay in the trace of the request that
created it; a claim whose stored trace context is corrupt is placed all the same. The API,
an allocator and a simulated node agent run as their own processes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from qshare.contracts import subjects

from .otlp_receiver import OtlpReceiver, ReceivedSpan
from .test_traces import (
    ADMIN_TOKEN,
    _claim_events,
    _service,
    _trace_of,
    _until_ready,
    otel_env,
    start_control_plane,
)
from .test_traces import receiver as receiver
from .test_traces import servers as servers

PENDING_TRACE = "7c1e3b0f9a5d4e2c8b6a4f2e0d1c3b5a"
PENDING_CALLER = "1a2b3c4d5e6f7a8b"
APPLY = subjects.node_command("waited-1", "apply")
CORRUPT = {
    "bad-parent": '{"traceparent": "00-not-a-trace-at-all-01", "tracestate": "x=1"}',
    "not-headers": '"a string, not the headers"',
    "zero-trace": '{"traceparent": "00-00000000000000000000000000000000-1a2b3c4d5e6f7a8b-01"}',
}
"""Stored values a placement must survive, by the claim's idempotency key."""


class Stack:
    """The services of this module, with the claims created before the node came."""

    def __init__(self, url: str, nats_url: str, allocator_log: Path) -> None:
        self.url, self.nats_url, self.allocator_log = url, nats_url, allocator_log
        self.claims: dict[str, str] = {}


def _create(url: str, key: str, traceparent: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    if traceparent is not None:
        headers["traceparent"] = traceparent
    body = {"priority": "low", "vcore": 10, "vmemory": "1Gi", "idempotency_key": key}
    for _ in range(300):  # until the allocator serves
        created = httpx.post(f"{url}/v1/claims", json=body, headers=headers, timeout=10)
        if created.status_code != 503:
            break
        time.sleep(0.1)
    assert created.status_code == 201, created.text
    assert created.json()["status"] == "pending", created.json()  # no node yet
    return str(created.json()["id"])


async def _corrupt(database_url: str, claims: dict[str, str]) -> None:
    engine = create_async_engine(database_url)
    try:
        async with engine.begin() as conn:
            for key, stored in CORRUPT.items():
                await conn.execute(
                    text("UPDATE claims SET trace_context = CAST(:v AS jsonb) WHERE id = :id"),
                    {"v": stored, "id": claims[key]},
                )
    finally:
        await engine.dispose()


@pytest.fixture(scope="module")
def stack(
    servers: tuple[str, str],
    receiver: OtlpReceiver,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    database_url, nats_url = servers
    logs = tmp_path_factory.mktemp("pending")
    otel = otel_env(receiver)
    port, running = start_control_plane(servers, otel, logs, "waiting")
    api = running[0]
    try:
        url = f"http://127.0.0.1:{port}"
        _until_ready(url, api, logs / "api.log")
        made = Stack(url, nats_url, logs / "allocator.log")
        made.claims["traced"] = _create(url, "traced", f"00-{PENDING_TRACE}-{PENDING_CALLER}-01")
        made.claims |= {key: _create(url, key, f"00-{PENDING_TRACE[::-1]}-{PENDING_CALLER}-01")
                        for key in CORRUPT}  # fmt: skip
        asyncio.run(_corrupt(database_url, made.claims))
        running.append(_service("qshare_node_agent", otel | {  # the node comes only now
            "QSHARE_NODE_NAME": "waited-1", "QSHARE_NODE_NATS_URL": nats_url,
            "QSHARE_NODE_SIMULATE": "1:16Gi", "QSHARE_NODE_SHM_DIR": str(logs),
            "QSHARE_NODE_SEGMENT": f"qshare-waited-{port}",
        }, logs / "agent.log"))  # fmt: skip
        yield made
    finally:
        for process in running:
            process.terminate()
            process.wait(10)


def _until_status(stack: Stack, claim_id: str, status: str) -> dict[str, object]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    got: dict[str, object] = {}
    for _ in range(300):
        got = httpx.get(f"{stack.url}/v1/claims/{claim_id}", headers=headers, timeout=10).json()
        if got["status"] == status:
            return got
        time.sleep(0.1)
    pytest.fail(f"claim never {status}: {got}; {stack.allocator_log.read_text()[-2000:]}")


def _of_trace(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    return {f"{s.service} {s.name}": s for s in spans if s.trace_id == PENDING_TRACE}


def test_a_claim_placed_by_the_sweep_carries_its_creators_trace_in_its_events(
    stack: Stack,
) -> None:
    claim_id = stack.claims["traced"]
    _until_status(stack, claim_id, "ready")
    events = _claim_events(stack.nats_url, claim_id, {"pending", "placed", "ready"})
    assert {"pending", "placed", "ready"} <= set(events), events
    assert {kind: _trace_of(parent) for kind, parent in events.items()} == dict.fromkeys(
        events, PENDING_TRACE
    )


def test_the_sweeps_placement_is_a_span_in_the_creators_trace(
    stack: Stack, receiver: OtlpReceiver
) -> None:
    _until_status(stack, stack.claims["traced"], "ready")
    wanted = {f"qshare-allocator {subjects.CLAIMS_CREATE}", "qshare-allocator claim.place"}
    by_name = _of_trace(receiver.wait_for(lambda found: wanted <= set(_of_trace(found))))
    assert wanted <= set(by_name), sorted(by_name)
    created = by_name[f"qshare-allocator {subjects.CLAIMS_CREATE}"]
    placed = by_name["qshare-allocator claim.place"]
    assert placed.parent_id == created.span_id
    assert placed.attributes["qshare.claim.id"] == stack.claims["traced"]
    assert placed.attributes["qshare.placed_by"] == "pending sweep"


def _carries_trace(span: ReceivedSpan) -> bool:
    """In the creator's trace, or linking it (an apply another change started, joined)."""
    return span.trace_id == PENDING_TRACE or any(t == PENDING_TRACE for t, _ in span.links)


def test_the_apply_that_sends_the_placed_claim_to_its_node_carries_the_creators_trace(
    stack: Stack, receiver: OtlpReceiver
) -> None:
    _until_status(stack, stack.claims["traced"], "ready")

    def applies(found: list[ReceivedSpan]) -> list[ReceivedSpan]:
        return [s for s in found if s.service == "qshare-allocator" and s.name == APPLY]

    spans = receiver.wait_for(lambda found: any(_carries_trace(s) for s in applies(found)))
    carrying = [s for s in applies(spans) if _carries_trace(s)]
    assert carrying, [(s.trace_id, s.links) for s in applies(spans)]
    assert carrying[0].kind == Span.SPAN_KIND_CLIENT


def test_a_corrupt_stored_trace_context_is_ignored_with_a_log_line_and_the_claim_placed(
    stack: Stack,
) -> None:
    for key in CORRUPT:
        _until_status(stack, stack.claims[key], "ready")
    logged = stack.allocator_log.read_text()
    for key in CORRUPT:
        assert f"claim {stack.claims[key]}: stored trace" in logged, logged[-3000:]
