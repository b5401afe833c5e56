"""Traces across services: the API, an allocator, the preemptor and a simulated node agent
run as their own processes, as in production, and export spans over OTLP/HTTP to a
collector double; a request's trace runs from the caller through the API (its HTTP spans are
FastAPI's own) and NATS into the services that act on it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import nats
import pytest
from nats.errors import TimeoutError as NatsTimeout
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from qshare.contracts import subjects
from qshare.testing.servers import EmbeddedNats, EmbeddedPostgres, free_port

from .otlp_receiver import OtlpReceiver, ReceivedSpan

ADMIN_TOKEN = "qs_telemetry_test_admin"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
SUSPEND_TRACE = "0af7651916cd43dd8448eb211c80319c"
SUSPEND_PARENT = f"00-{SUSPEND_TRACE}-b7ad6b7169203331-01"
RELEASE_TRACE = "5b8aa5a2d2c872e8321cf37308d69df2"
RELEASE_PARENT = f"00-{RELEASE_TRACE}-051581bf3cb55c13-01"
APPLY = subjects.node_command("traced-1", "apply")


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


@pytest.fixture(scope="module")
async def servers() -> AsyncIterator[tuple[str, str]]:
    async with EmbeddedPostgres(durable=False) as pg, EmbeddedNats() as nats:
        yield pg.url, nats.url


def _service(module: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", module], env=os.environ | env,
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip


def otel_env(receiver: OtlpReceiver) -> dict[str, str]:
    """The services' exporter settings: to the receiver, every 200 ms."""
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "200"}


def start_control_plane(
    servers: tuple[str, str], otel: dict[str, str], logs: Path, instance: str
) -> tuple[int, list[subprocess.Popen[bytes]]]:
    """Migrate, then start the allocator and the API (on a free port, returned with the API's
    process and the allocator's)."""
    database_url, nats_url = servers
    allocator_env = {
        "QSHARE_ALLOCATOR_DATABASE_URL": database_url, "QSHARE_ALLOCATOR_NATS_URL": nats_url,
        "QSHARE_ALLOCATOR_INSTANCE": instance,
    }  # fmt: skip
    migrate = [sys.executable, "-m", "qshare_allocator", "migrate"]
    subprocess.run(migrate, env=os.environ | allocator_env, check=True, capture_output=True)
    allocator = _service("qshare_allocator", otel | allocator_env, logs / "allocator.log")
    port = free_port()
    api = _service("qshare_api", otel | {
        "QSHARE_API_DATABASE_URL": database_url, "QSHARE_API_NATS_URL": nats_url,
        "QSHARE_API_PORT": str(port), "QSHARE_API_BOOTSTRAP_ADMIN_TOKEN": ADMIN_TOKEN,
    }, logs / "api.log")  # fmt: skip
    return port, [api, allocator]


@pytest.fixture(scope="module")
def api_url(
    servers: tuple[str, str], receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    database_url, nats_url = servers
    logs = tmp_path_factory.mktemp("services")
    otel = otel_env(receiver)
    port, (api, allocator) = start_control_plane(servers, otel, logs, "traced")
    preemptor = _service("qshare_preemptor", otel | {
        "QSHARE_PREEMPTOR_DATABASE_URL": database_url, "QSHARE_PREEMPTOR_NATS_URL": nats_url,
    }, logs / "preemptor.log")  # fmt: skip
    agent = _service("qshare_node_agent", otel | {
        "QSHARE_NODE_NAME": "traced-1", "QSHARE_NODE_NATS_URL": nats_url,
        "QSHARE_NODE_SIMULATE": "1:16Gi", "QSHARE_NODE_SHM_DIR": str(logs),
        "QSHARE_NODE_SEGMENT": f"qshare-traced-{port}",
    }, logs / "agent.log")  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        _until_ready(url, api, logs / "api.log")
        _until_node_ready(url, "traced-1", logs / "agent.log")
        yield url
    finally:
        for process in (api, agent, preemptor, allocator):
            process.terminate()
            process.wait(10)


def _until_ready(url: str, api: subprocess.Popen[bytes], log: Path) -> None:
    for _ in range(300):
        if api.poll() is not None:
            pytest.fail(f"the API exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    pytest.fail(f"the API never became ready: {log.read_text()[-2000:]}")


def _until_node_ready(url: str, node: str, log: Path) -> None:
    """Wait until the node agent has registered: a claim created before that waits for room
    and is placed by the allocator's sweep, outside the caller's trace."""
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    for _ in range(300):
        found = httpx.get(f"{url}/v1/nodes/{node}", headers=headers, timeout=1)
        if found.status_code == 200 and found.json().get("status") == "Ready":
            return
        time.sleep(0.1)
    pytest.fail(f"node {node} never became Ready: {log.read_text()[-2000:]}")


def _create_claim(url: str) -> httpx.Response:
    headers = {
        "Authorization": f"Bearer {ADMIN_TOKEN}",
        "traceparent": f"00-{TRACE_ID}-{CALLER_SPAN}-01",
    }
    body = {"priority": "low", "vcore": 10, "vmemory": "1Gi", "idempotency_key": "traced-1"}
    return httpx.post(f"{url}/v1/claims", json=body, headers=headers, timeout=10)


def _of_trace(spans: list[ReceivedSpan], trace_id: str = TRACE_ID) -> dict[str, ReceivedSpan]:
    """One trace's spans, by service and name."""
    return {f"{s.service} {s.name}": s for s in spans if s.trace_id == trace_id}


@pytest.fixture(scope="module")
def traced_claim(api_url: str) -> str:
    """The id of the claim created in the caller's trace `TRACE_ID`."""
    created = _create_claim(api_url)
    assert created.status_code == 201
    return str(created.json()["id"])


@pytest.fixture(scope="module")
def claim_trace(traced_claim: str, receiver: OtlpReceiver) -> dict[str, ReceivedSpan]:
    expected = {
        "qshare-api POST /v1/claims",
        f"qshare-api {subjects.CLAIMS_CREATE}",
        f"qshare-allocator {subjects.CLAIMS_CREATE}",
    }
    spans = receiver.wait_for(lambda found: expected <= set(_of_trace(found)))
    return _of_trace(spans)


def test_the_api_continues_the_callers_trace_with_a_server_span(
    claim_trace: dict[str, ReceivedSpan],
) -> None:
    server = claim_trace["qshare-api POST /v1/claims"]
    assert (server.parent_id, server.kind) == (CALLER_SPAN, Span.SPAN_KIND_SERVER)
    assert server.attributes["http.response.status_code"] == 201


def test_the_request_to_the_allocator_is_a_client_span_within_the_api_span(
    claim_trace: dict[str, ReceivedSpan],
) -> None:
    server = claim_trace["qshare-api POST /v1/claims"]
    endpoint = claim_trace["qshare-api fastapi.endpoint"]
    client = claim_trace[f"qshare-api {subjects.CLAIMS_CREATE}"]
    assert endpoint.parent_id == server.span_id
    assert (client.parent_id, client.kind) == (endpoint.span_id, Span.SPAN_KIND_CLIENT)


def test_the_allocator_handles_the_request_in_the_same_trace(
    claim_trace: dict[str, ReceivedSpan],
) -> None:
    client = claim_trace[f"qshare-api {subjects.CLAIMS_CREATE}"]
    handled = claim_trace[f"qshare-allocator {subjects.CLAIMS_CREATE}"]
    assert (handled.parent_id, handled.kind) == (client.span_id, Span.SPAN_KIND_SERVER)
    assert handled.attributes["qshare.outcome"] == "ok"


def test_an_otlp_endpoint_that_is_not_a_url_stops_the_service_naming_the_variable(
    tmp_path: Path,
) -> None:
    env = os.environ | {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318",
                        "QSHARE_ALLOCATOR_NATS_URL": "nats://127.0.0.1:1"}  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "qshare_allocator"], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0
    assert "OTEL_EXPORTER_OTLP_ENDPOINT='collector:4318'" in done.stderr


def _suspend(url: str, claim_id: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "traceparent": SUSPEND_PARENT}
    return httpx.post(f"{url}/v1/claims/{claim_id}/suspend", headers=headers, timeout=10)


def _ready_claim(url: str, key: str = "traced-2") -> str:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    body = {"priority": "low", "vcore": 10, "vmemory": "1Gi", "idempotency_key": key}
    claim = httpx.post(f"{url}/v1/claims", json=body, headers=headers, timeout=10).json()
    for _ in range(200):
        got = httpx.get(f"{url}/v1/claims/{claim['id']}", headers=headers, timeout=10).json()
        if got["status"] == "ready":
            return str(claim["id"])
        time.sleep(0.1)
    pytest.fail(f"claim never ready: {got}")


def test_an_operator_suspension_runs_from_the_api_through_the_preemptor_to_the_node(
    api_url: str, receiver: OtlpReceiver
) -> None:
    assert _suspend(api_url, _ready_claim(api_url)).status_code == 200
    wanted = {
        f"qshare-preemptor {subjects.CLAIMS_SUSPEND}",
        "qshare-node-agent qshare.node.traced-1.cmd.suspend",
    }
    spans = receiver.wait_for(lambda found: wanted <= set(_of_trace(found, SUSPEND_TRACE)))
    by_name = _of_trace(spans, SUSPEND_TRACE)
    preemptor = by_name[f"qshare-preemptor {subjects.CLAIMS_SUSPEND}"]
    node = by_name["qshare-node-agent qshare.node.traced-1.cmd.suspend"]
    command = by_name["qshare-preemptor qshare.node.traced-1.cmd.suspend"]
    assert (preemptor.kind, node.kind) == (Span.SPAN_KIND_SERVER, Span.SPAN_KIND_SERVER)
    assert node.parent_id == command.span_id


def _claim_events(nats_url: str, claim_id: str, kinds: set[str]) -> dict[str, str]:
    """traceparent (or "") of each event of the claim kept in the events stream, by kind,
    once `kinds` are all there (or after 20 s)."""
    deadline = time.monotonic() + 20
    while True:
        found = asyncio.run(_kept_events(nats_url, claim_id))
        if kinds <= set(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


async def _kept_events(nats_url: str, claim_id: str) -> dict[str, str]:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        sub = await js.subscribe(subjects.claim_event(claim_id, "*"), ordered_consumer=True)
        found: dict[str, str] = {}
        while True:
            try:
                msg = await sub.next_msg(timeout=0.5)
            except NatsTimeout:
                return found
            found[msg.subject.rsplit(".", 1)[1]] = (msg.headers or {}).get("traceparent", "")
    finally:
        await nc.close()


def _trace_of(traceparent: str) -> str:
    return traceparent.split("-")[1] if traceparent.count("-") == 3 else ""


def test_the_allocator_sends_the_placed_claim_to_its_node_within_the_claims_trace(
    claim_trace: dict[str, ReceivedSpan], receiver: OtlpReceiver
) -> None:
    wanted = {f"qshare-allocator {APPLY}", f"qshare-node-agent {APPLY}"}
    by_name = _of_trace(receiver.wait_for(lambda found: wanted <= set(_of_trace(found))))
    sent, applied = by_name[f"qshare-allocator {APPLY}"], by_name[f"qshare-node-agent {APPLY}"]
    handled = claim_trace[f"qshare-allocator {subjects.CLAIMS_CREATE}"]
    assert (sent.parent_id, sent.kind) == (handled.span_id, Span.SPAN_KIND_CLIENT)
    assert (applied.parent_id, applied.kind) == (sent.span_id, Span.SPAN_KIND_SERVER)


def test_the_claims_events_through_the_outbox_carry_the_callers_trace(
    servers: tuple[str, str], traced_claim: str
) -> None:
    events = _claim_events(servers[1], traced_claim, {"ready"})
    assert "ready" in events, events
    assert {kind: _trace_of(parent) for kind, parent in events.items()} == dict.fromkeys(
        events, TRACE_ID
    )


def test_the_suspended_event_the_preemptor_publishes_carries_the_operators_trace(
    api_url: str, servers: tuple[str, str]
) -> None:
    claim_id = _ready_claim(api_url, "traced-3")
    assert _suspend(api_url, claim_id).status_code == 200
    events = _claim_events(servers[1], claim_id, {"suspended"})
    assert _trace_of(events.get("suspended", "")) == SUSPEND_TRACE, events


def test_a_release_runs_to_the_node_and_its_released_event_in_the_callers_trace(
    api_url: str, servers: tuple[str, str], receiver: OtlpReceiver
) -> None:
    claim_id = _ready_claim(api_url, "traced-4")
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "traceparent": RELEASE_PARENT}
    deleted = httpx.delete(f"{api_url}/v1/claims/{claim_id}", headers=headers, timeout=10)
    assert deleted.status_code in (200, 202), deleted.text
    events = _claim_events(servers[1], claim_id, {"released"})
    assert _trace_of(events.get("released", "")) == RELEASE_TRACE, events
    wanted = {f"qshare-allocator {subjects.CLAIMS_DELETE}", f"qshare-node-agent {APPLY}"}
    spans = receiver.wait_for(lambda found: wanted <= set(_of_trace(found, RELEASE_TRACE)))
    assert wanted <= set(_of_trace(spans, RELEASE_TRACE))
