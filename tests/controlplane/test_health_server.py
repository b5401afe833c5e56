"""The health server every non-HTTP service shares (qshare.health), on a real socket: answers
are JSON naming each check, a check that raises or hangs fails by name (never a 500), a
request it cannot serve gets a 4xx, and bad settings name the variable."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator

import httpx
import pytest

from qshare import health
from qshare.envsettings import SettingsError, load
from qshare.health import HealthServer, ListenError, Probes
from qshare.testing.servers import free_port
from qshare_allocator.__main__ import main as allocator_main
from qshare_allocator.app import Allocator
from qshare_allocator.settings import AllocatorSettings
from qshare_node_agent.settings import NodeAgentSettings
from qshare_preemptor.settings import PreemptorSettings


async def holds() -> str | None:
    return None


async def broken() -> str | None:
    raise RuntimeError("the check itself broke\nsecond line")


async def hangs() -> str | None:
    await asyncio.sleep(3600)
    return None


PORTS: dict[int, int] = {}
"""Each served Probes' port, by id."""


@pytest.fixture
async def probes() -> AsyncIterator[Probes]:
    """Probes with one live check that holds, served on a free port of 127.0.0.1."""
    found = Probes()
    found.live["loop"] = holds
    server = HealthServer(found, "127.0.0.1", free_port(), "QSHARE_TEST_HEALTH_PORT")
    await server.start()
    PORTS[id(found)] = server.port
    yield found
    await server.stop()


async def get(probes: Probes, path: str, method: str = "GET") -> httpx.Response:
    base = f"http://127.0.0.1:{PORTS[id(probes)]}"
    async with httpx.AsyncClient(base_url=base, timeout=5) as client:
        return await client.request(method, path)


async def raw(probes: Probes, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", PORTS[id(probes)])
    writer.write(request)
    answer = await reader.read()
    writer.close()
    return answer


async def test_a_service_that_has_not_finished_starting_is_live_but_not_ready(
    probes: Probes,
) -> None:
    live, ready = await get(probes, "/healthz"), await get(probes, "/readyz")
    assert (live.status_code, live.json()["status"]) == (200, "live")
    assert ready.status_code == 503
    assert ready.json() == {
        "status": "not ready",
        "failing": ["serving"],
        "checks": {"serving": "starting"},
    }
    probes.serving()
    assert (await get(probes, "/readyz")).status_code == 200


async def test_a_check_that_raises_fails_by_name_with_its_error_in_one_line(
    probes: Probes,
) -> None:
    probes.serving()
    probes.ready["database"] = broken
    answer = await get(probes, "/readyz")
    assert answer.status_code == 503
    assert answer.headers["content-type"] == "application/json"
    assert answer.json()["checks"]["database"] == (
        "check failed: RuntimeError: the check itself broke"
    )


async def test_a_check_that_does_not_answer_fails_by_name(
    probes: Probes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(health, "CHECK_TIMEOUT_S", 0.05)
    probes.live["tasks"] = hangs
    answer = await get(probes, "/healthz")
    assert answer.status_code == 503
    assert answer.json()["failing"] == ["tasks"]
    assert answer.json()["checks"]["tasks"] == "no answer within 0.05 s"


async def test_an_ended_task_fails_liveness_naming_the_task_and_its_error(
    probes: Probes,
) -> None:
    async def crashes() -> None:
        raise ValueError("boom")

    task = asyncio.create_task(crashes(), name="pending sweeper")
    await asyncio.wait({task})
    probes.live["tasks"] = health.tasks_running(lambda: [task])
    answer = await get(probes, "/healthz")
    assert answer.status_code == 503
    assert answer.json()["checks"]["tasks"] == "task pending sweeper ended: ValueError: boom"


async def test_a_head_request_gets_the_status_without_a_body(probes: Probes) -> None:
    answer = await get(probes, "/healthz", "HEAD")
    assert (answer.status_code, answer.content) == (200, b"")


@pytest.mark.parametrize(
    ("method", "path", "status", "error"),
    [
        ("GET", "/metrics", 404, "no /metrics: this server answers /healthz and /readyz"),
        ("POST", "/readyz", 405, "POST /readyz: only GET and HEAD"),
    ],
)
async def test_other_paths_and_methods_get_a_json_error_naming_what_is_served(
    probes: Probes, method: str, path: str, status: int, error: str
) -> None:
    answer = await get(probes, path, method)
    assert (answer.status_code, answer.json()) == (status, {"error": error})


async def test_a_request_that_is_not_http_gets_a_400(probes: Probes) -> None:
    answer = await raw(probes, b"hello there\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert answer.endswith(b'{"error": "not an HTTP/1.x request line"}')


async def test_a_request_head_over_the_limit_gets_a_431(probes: Probes) -> None:
    answer = await raw(probes, b"GET /healthz HTTP/1.1\r\nX: " + b"a" * 10_000 + b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 431 ")


async def test_the_server_answers_others_while_a_client_sends_nothing(probes: Probes) -> None:
    _, silent = await asyncio.open_connection("127.0.0.1", PORTS[id(probes)])
    try:
        assert (await get(probes, "/healthz")).status_code == 200
    finally:
        silent.close()


async def test_probes_that_come_together_share_one_run_of_the_checks(probes: Probes) -> None:
    """A burst of probes costs the database one connection, not one per probe (the checks
    share the service's own pool)."""
    runs = 0

    async def counted() -> str | None:
        nonlocal runs
        runs += 1
        await asyncio.sleep(1.0)
        return None

    probes.serving()
    probes.ready["database"] = counted
    answers = await asyncio.gather(*(get(probes, "/readyz") for _ in range(20)))
    assert [a.status_code for a in answers] == [200] * 20
    assert runs <= 2


async def test_a_probe_after_a_run_ended_runs_the_checks_again(probes: Probes) -> None:
    states = iter(["down", None])

    async def flips() -> str | None:
        return next(states)

    probes.serving()
    probes.ready["database"] = flips
    assert (await get(probes, "/readyz")).status_code == 503
    assert (await get(probes, "/readyz")).status_code == 200


async def test_silent_clients_hold_no_more_than_a_bounded_number_of_sockets(
    probes: Probes,
) -> None:
    """Clients that connect and send nothing (slowloris) cannot pile up the service's file
    descriptors: past the limit, the longest waiting is closed, and a probe is still served."""
    port = PORTS[id(probes)]
    silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(150)]
    try:
        answer = await get(probes, "/healthz")
        assert answer.status_code == 200
        await asyncio.sleep(0.2)
        closed = [reader.at_eof() for reader, _ in silent]
        assert sum(closed) >= 150 - health.MAX_WAITING
        assert not any(closed[-health.MAX_WAITING + 1 :])  # the newest ones are kept
    finally:
        for _, writer in silent:
            writer.close()


async def test_a_client_that_half_closes_after_its_request_still_gets_the_answer(
    probes: Probes,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", PORTS[id(probes)])
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    writer.write_eof()
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")


@pytest.mark.parametrize(
    ("settings", "variable"),
    [
        (AllocatorSettings, "QSHARE_ALLOCATOR_HEALTH_PORT"),
        (PreemptorSettings, "QSHARE_PREEMPTOR_HEALTH_PORT"),
        (NodeAgentSettings, "QSHARE_NODE_HEALTH_PORT"),
    ],
)
def test_a_negative_health_port_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, settings: type[AllocatorSettings], variable: str
) -> None:
    monkeypatch.setenv(variable, "-1")
    with pytest.raises(SettingsError) as err:
        load(settings)
    assert err.value.problems == [f"{variable}='-1': Input should be greater than or equal to 0"]


async def test_a_health_port_in_use_stops_the_start_naming_the_variable() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        allocator = Allocator(AllocatorSettings(health_port=port))
        with pytest.raises(ListenError) as err:
            await allocator.start()
    assert str(err.value).startswith(
        f"QSHARE_ALLOCATOR_HEALTH_PORT={port}: the health server cannot listen on 127.0.0.1:"
    )


def test_the_allocator_with_its_health_port_in_use_exits_with_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setenv("QSHARE_ALLOCATOR_HEALTH_PORT", str(port))
        assert allocator_main([]) == 1
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(
        f"qshare allocator: cannot start: QSHARE_ALLOCATOR_HEALTH_PORT={port}: the health "
        f"server cannot listen on 127.0.0.1:{port} ("
    )


def test_a_stuck_event_loop_answers_no_liveness_probe_until_it_moves_again() -> None:
    """The server runs on the service's own loop: a loop blocked by a call that never returns
    leaves the kubelet's probe without an answer (its timeout counts as a failure)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = HealthServer(Probes(), "127.0.0.1", 0, "QSHARE_TEST_HEALTH_PORT")
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(5)
    url = f"http://127.0.0.1:{server.port}/healthz"
    release = threading.Event()
    try:
        assert httpx.get(url, timeout=5).status_code == 200
        loop.call_soon_threadsafe(release.wait, 30)  # the loop is stuck in this call
        with pytest.raises(httpx.ReadTimeout):
            httpx.get(url, timeout=0.5)
        release.set()
        assert httpx.get(url, timeout=5).status_code == 200
    finally:
        release.set()
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
