"""The development stack's compose file (no Docker engine here): valid against the compose
specification, every long-running service has a healthcheck, a service starts only once
what it needs is healthy, and the readiness probe it runs works against a real health
server."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from importlib.resources import files
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from qshare import health
from qshare.testing.servers import free_port
from qshare_api.settings import ApiSettings

COMPOSE = Path(__file__).parents[2] / "compose" / "docker-compose.yml"
ONE_SHOT = {"secrets", "migrate"}
"""Services that run to completion (others wait for `service_completed_successfully`)."""
QSHARE_HEALTH = {
    "allocator": "QSHARE_ALLOCATOR_HEALTH_PORT",
    "preemptor": "QSHARE_PREEMPTOR_HEALTH_PORT",
    "node-sim-1": "QSHARE_NODE_HEALTH_PORT",
    "node-sim-2": "QSHARE_NODE_HEALTH_PORT",
}
"""qshare services whose /readyz is on their health port (the API's is on its own port)."""


def _services() -> dict[str, Any]:
    services: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]
    return services


def _spec_problems(text: str) -> list[str]:
    """What the compose specification finds wrong in the compose file `text`."""
    spec = files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    schema = json.loads(spec.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [e.message for e in validator.iter_errors(yaml.safe_load(text))]


def test_the_compose_file_is_valid_against_the_compose_specification() -> None:
    assert _spec_problems(COMPOSE.read_text()) == []


def test_the_api_says_how_to_trust_a_reverse_proxy_and_stays_valid_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Behind a proxy every failed authentication shares its address unless
    QSHARE_API_TRUSTED_PROXIES names it: the API's environment carries the variable commented
    out; made live, the file stays valid and the API reads a network from it."""
    lines = COMPOSE.read_text().splitlines()
    [at] = [i for i, line in enumerate(lines) if line.strip().startswith("# QSHARE_API_TRUSTED")]
    lines[at] = lines[at].replace("# ", "", 1)
    text = "\n".join(lines) + "\n"
    assert _spec_problems(text) == []
    for name in [n for n in os.environ if n.startswith("QSHARE_")]:
        monkeypatch.delenv(name)
    for name, value in yaml.safe_load(text)["services"]["api"]["environment"].items():
        monkeypatch.setenv(name, str(value))
    assert [str(n) for n in ApiSettings().trusted_proxies] == ["172.16.0.0/12"]


@pytest.mark.parametrize("name", sorted(set(_services()) - ONE_SHOT))
def test_every_long_running_service_has_a_healthcheck(name: str) -> None:
    check = _services()[name].get("healthcheck", {})
    assert check.get("test", ["NONE"])[0] in ("CMD", "CMD-SHELL"), f"{name}: no healthcheck"


@pytest.mark.parametrize("name", sorted(_services()))
def test_a_service_starts_once_what_it_needs_is_healthy_or_done(name: str) -> None:
    needs = _services()[name].get("depends_on", {})
    expected = {
        other: "service_completed_successfully" if other in ONE_SHOT else "service_healthy"
        for other in needs
    }
    assert {other: need["condition"] for other, need in needs.items()} == expected


@pytest.mark.parametrize("name", sorted(QSHARE_HEALTH))
def test_a_qshare_service_probes_the_health_port_it_serves(name: str) -> None:
    service = _services()[name]
    port = service["environment"][QSHARE_HEALTH[name]]
    assert service["healthcheck"]["test"][-1] == port


def test_the_api_probes_the_port_it_listens_on() -> None:
    api = _services()["api"]
    assert api["ports"] == [f"8080:{api['healthcheck']['test'][-1]}"]


def _probe_on(port: int) -> list[str]:
    """The qshare services' healthcheck command, run by this interpreter on `port`."""
    command = list(_services()["preemptor"]["healthcheck"]["test"])
    assert command[:2] == ["CMD", "python"]
    return [sys.executable, *command[2:-1], str(port)]


async def _exit_status(command: list[str]) -> int:
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    return await process.wait()


@pytest.mark.parametrize(("serving", "status"), [(True, 0), (False, 1)])
async def test_the_readiness_healthcheck_passes_only_while_the_service_is_ready(
    serving: bool, status: int
) -> None:
    probes = health.Probes()
    if serving:
        probes.serving()
    port = free_port()
    server = health.HealthServer(probes, "127.0.0.1", port, "TEST_HEALTH_PORT")
    await server.start()
    try:
        assert await _exit_status(_probe_on(port)) == status
    finally:
        await server.stop()


async def test_the_readiness_healthcheck_fails_where_nothing_listens() -> None:
    assert await _exit_status(_probe_on(free_port())) == 1
