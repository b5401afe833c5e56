"""Deployment secrets and exposure (issue 11): generated secrets, identities read from a
secrets directory, compose without a guessable token, metrics on loopback by default."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import psutil
import pytest
import yaml
from pydantic import ValidationError

from qshare.bus import close, connect
from qshare.health import ListenError
from qshare.natsauth import (
    ADMIN_TOKEN_FILE,
    CONFIG_FILE,
    NatsAuth,
    ServiceRole,
    init_secrets,
    nats_credentials,
)
from qshare.testing.servers import EmbeddedNats, free_port
from qshare_allocator.app import Allocator
from qshare_allocator.settings import AllocatorSettings
from qshare_api.app import create_app
from qshare_api.settings import ApiSettings
from tests.controlplane.conftest import RULES, as_identity

COMPOSE = Path(__file__).parents[2] / "compose" / "docker-compose.yml"


def test_secrets_are_generated_once_and_kept(tmp_path: Path) -> None:
    init_secrets(tmp_path, [])
    token = (tmp_path / ADMIN_TOKEN_FILE).read_text()
    api = nats_credentials("api", secrets_dir=tmp_path).password.get_secret_value()
    init_secrets(tmp_path, ["n1"])
    assert (tmp_path / ADMIN_TOKEN_FILE).read_text() == token
    assert nats_credentials("api", secrets_dir=tmp_path).password.get_secret_value() == api
    assert nats_credentials("node", "n1", secrets_dir=tmp_path).user == "node-n1"
    assert (tmp_path / CONFIG_FILE).stat().st_mode & 0o077 == 0


def test_a_secrets_directory_of_another_deployment_has_other_secrets(tmp_path: Path) -> None:
    init_secrets(tmp_path / "a", [])
    init_secrets(tmp_path / "b", [])
    assert (tmp_path / "a" / ADMIN_TOKEN_FILE).read_text() != (
        tmp_path / "b" / ADMIN_TOKEN_FILE
    ).read_text()


async def test_a_service_connects_with_the_identity_in_its_secrets_directory(
    tmp_path: Path,
) -> None:
    init_secrets(tmp_path, [])
    async with EmbeddedNats(config=(tmp_path / CONFIG_FILE).read_text()) as server:
        settings = ApiSettings(nats_url=server.url, nats_secrets_dir=tmp_path)
        nc = await connect(settings.bus("test"))
        assert nc.is_connected
        await close(nc)


def test_compose_ships_no_token_and_gives_nats_its_identities() -> None:
    stack = yaml.safe_load(COMPOSE.read_text())
    services = stack["services"]
    api_env = services["api"]["environment"]
    assert "QSHARE_API_BOOTSTRAP_ADMIN_TOKEN" not in api_env
    assert api_env["QSHARE_API_BOOTSTRAP_ADMIN_TOKEN_FILE"].startswith("/secrets/")
    assert "/secrets/nats.conf" in services["nats"]["command"]
    assert services["allocator"]["environment"]["QSHARE_ALLOCATOR_NATS_SECRETS_DIR"] == "/secrets"


def metrics_settings(database_url: str, bus_url: str, nats_auth: NatsAuth) -> AllocatorSettings:
    found = nats_auth.credentials(ServiceRole.ALLOCATOR)
    return AllocatorSettings(
        database_url=database_url, nats_url=bus_url, metrics_port=free_port(), cluster=RULES,
        nats_user=found.user, nats_password=found.password,
    )  # fmt: skip


def listening_on(port: int) -> set[str]:
    return {
        c.laddr.ip
        for c in psutil.net_connections("tcp")
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
    }


async def test_the_allocator_metrics_listen_on_loopback_by_default(
    database_url: str, bus_url: str, nats_auth: NatsAuth
) -> None:
    settings = metrics_settings(database_url, bus_url, nats_auth)
    async with Allocator(settings):
        listening = listening_on(settings.metrics_port)
    assert listening == {"127.0.0.1"}


async def test_a_stopped_allocator_no_longer_serves_its_metrics(
    database_url: str, bus_url: str, nats_auth: NatsAuth
) -> None:
    settings = metrics_settings(database_url, bus_url, nats_auth)
    async with Allocator(settings), httpx.AsyncClient() as client:
        served = await client.get(f"http://127.0.0.1:{settings.metrics_port}/metrics")
    assert "qshare_allocator_messages_total" in served.text
    assert listening_on(settings.metrics_port) == set()


async def test_an_allocator_whose_metrics_port_is_taken_stops_its_start_naming_the_setting(
    database_url: str, bus_url: str, nats_auth: NatsAuth
) -> None:
    settings = metrics_settings(database_url, bus_url, nats_auth)
    allocator = Allocator(settings)
    with socket.create_server(("127.0.0.1", settings.metrics_port)):
        named = f"QSHARE_ALLOCATOR_METRICS_PORT={settings.metrics_port}"
        with pytest.raises(ListenError, match=named):
            await allocator.start()
        await allocator.stop()


def test_a_metrics_port_past_65535_is_refused() -> None:
    with pytest.raises(ValidationError, match="metrics_port"):
        AllocatorSettings(metrics_port=70000)


def api_metrics_settings(database_url: str, bus_url: str, nats_auth: NatsAuth) -> ApiSettings:
    return ApiSettings(
        database_url=database_url, nats_url=bus_url, metrics_port=free_port(), cluster=RULES,
        **as_identity(nats_auth, ServiceRole.API),
    )  # fmt: skip


async def test_the_api_serves_metrics_on_its_metrics_port_until_it_stops(
    database_url: str, bus_url: str, nats_auth: NatsAuth
) -> None:
    """The scheduler extender's pods let Prometheus reach that port and not their HTTP one."""
    settings = api_metrics_settings(database_url, bus_url, nats_auth)
    app = create_app(settings)
    async with app.router.lifespan_context(app), httpx.AsyncClient() as client:
        served = await client.get(f"http://127.0.0.1:{settings.metrics_port}/metrics")
    assert "process_cpu_seconds_total" in served.text
    assert listening_on(settings.metrics_port) == set()


async def test_an_api_whose_metrics_port_is_taken_stops_its_start_naming_the_setting(
    database_url: str, bus_url: str, nats_auth: NatsAuth
) -> None:
    settings = api_metrics_settings(database_url, bus_url, nats_auth)
    app = create_app(settings)
    with socket.create_server(("127.0.0.1", settings.metrics_port)):
        named = f"QSHARE_API_METRICS_PORT={settings.metrics_port}"
        with pytest.raises(ListenError, match=named):
            async with app.router.lifespan_context(app):
                pass


def test_a_preemptor_rollout_stops_the_old_pod_before_starting_the_new() -> None:
    """One preemptor acts on card events: the Deployment's default rolling update started
    the new pod beside the old, and both suspended, resumed and recorded every gang (each
    writing its own `gang` record) until the old one stopped."""
    manifest = Path(__file__).parents[2] / "deploy" / "kubernetes" / "base" / "preemptor.yaml"
    (deployment,) = [
        d for d in yaml.safe_load_all(manifest.read_text()) if d["kind"] == "Deployment"
    ]
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"].get("strategy", {}).get("type") == "Recreate"
