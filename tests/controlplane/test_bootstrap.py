"""The bootstrap admin token is stored once and never resurrected (issue 11, item 4)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from qshare.envsettings import SettingsError, load
from qshare.natsauth import NatsAuth, ServiceRole
from qshare.testing.servers import EmbeddedPostgres
from qshare_allocator.migrate import upgrade
from qshare_api.app import create_app
from qshare_api.settings import ApiSettings
from tests.controlplane.conftest import as_identity, auth

SECRET = "qs_bootstrap_secret_for_this_test"


@pytest.fixture(scope="module")
async def fresh_database() -> AsyncIterator[str]:
    async with EmbeddedPostgres(durable=False) as server:
        await upgrade(server.url)
        yield server.url


@asynccontextmanager
async def api_started(
    database_url: str, bus_url: str, secret: str, nats_auth: NatsAuth
) -> AsyncIterator[httpx.AsyncClient]:
    """One start of the API process, with the bootstrap variable set to `secret`."""
    settings = ApiSettings(
        database_url=database_url, nats_url=bus_url, bootstrap_admin_token=secret,
        **as_identity(nats_auth, ServiceRole.API),
    )  # fmt: skip
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            yield client


async def test_a_revoked_bootstrap_token_stays_revoked_after_a_restart(
    fresh_database: str, bus_url: str, nats_auth: NatsAuth
) -> None:
    async with api_started(fresh_database, bus_url, SECRET, nats_auth) as api:
        listed = (await api.get("/v1/tokens", headers=auth(SECRET))).json()
        (bootstrap,) = [t for t in listed if t["name"] == "bootstrap admin"]
        successor = await api.post(
            "/v1/tokens",
            json={"name": "ops", "tenant": "ops", "role": "admin"},
            headers=auth(SECRET),
        )
        assert (
            await api.delete(f"/v1/tokens/{bootstrap['id']}", headers=auth(SECRET))
        ).status_code == 204
    async with api_started(fresh_database, bus_url, SECRET, nats_auth) as api:
        assert (await api.get("/v1/tokens", headers=auth(SECRET))).status_code == 401
        ops = auth(successor.json()["token"])
        assert [t["name"] for t in (await api.get("/v1/tokens", headers=ops)).json()] == ["ops"]


async def test_a_different_bootstrap_secret_later_is_ignored(
    fresh_database: str, bus_url: str, nats_auth: NatsAuth
) -> None:
    async with api_started(fresh_database, bus_url, SECRET, nats_auth):
        pass
    async with api_started(
        fresh_database, bus_url, "qs_a_second_bootstrap_secret", nats_auth
    ) as api:
        assert (
            await api.get("/v1/nodes", headers=auth("qs_a_second_bootstrap_secret"))
        ).status_code == 401


async def test_an_empty_bootstrap_token_file_stops_the_start_and_issues_nothing(
    tmp_path: Path, bus_url: str, nats_auth: NatsAuth
) -> None:
    """An empty token file (a Secret whose generation was cut short) is refused naming the
    variable; recorded as issued, it would have made the real token, once there, ignored."""
    empty = tmp_path / "admin.token"
    empty.write_text("\n")
    async with EmbeddedPostgres(durable=False) as server:
        await upgrade(server.url)
        settings = ApiSettings(
            database_url=server.url, nats_url=bus_url, bootstrap_admin_token_file=empty,
            **as_identity(nats_auth, ServiceRole.API),
        )  # fmt: skip
        app = create_app(settings)
        with pytest.raises(ValueError, match="QSHARE_API_BOOTSTRAP_ADMIN_TOKEN_FILE"):
            async with app.router.lifespan_context(app):
                pass
        async with api_started(server.url, bus_url, SECRET, nats_auth) as api:
            assert (await api.get("/v1/tokens", headers=auth(SECRET))).status_code == 200


def test_a_blank_bootstrap_token_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("QSHARE_API_BOOTSTRAP_ADMIN_TOKEN", "  ")
    with pytest.raises(SettingsError, match="QSHARE_API_BOOTSTRAP_ADMIN_TOKEN"):
        load(ApiSettings)


async def test_a_failed_start_closes_its_nats_connection(
    tmp_path: Path, bus_url: str, nats_auth: NatsAuth, database_url: str
) -> None:
    """What the start had opened before it failed is closed (the API in a process exits, but
    one started in-process, as `qshare up` and the tests do, would keep a NATS client)."""
    empty = tmp_path / "admin.token"
    empty.write_text("")
    settings = ApiSettings(
        database_url=database_url, nats_url=bus_url, bootstrap_admin_token_file=empty,
        **as_identity(nats_auth, ServiceRole.API),
    )  # fmt: skip
    before = _nats_tasks()
    app = create_app(settings)
    with pytest.raises(ValueError, match="is empty"):
        async with app.router.lifespan_context(app):
            pass
    await asyncio.sleep(0.1)
    assert _nats_tasks() - before == set()


def _nats_tasks() -> set[asyncio.Task[object]]:
    """The running tasks of NATS clients (their read loops, pings and flushers)."""
    return {
        task for task in asyncio.all_tasks()
        if "/nats/" in getattr(getattr(task.get_coro(), "cr_code", None), "co_filename", "")
    }  # fmt: skip


@pytest.fixture
async def empty_database() -> AsyncIterator[str]:
    async with EmbeddedPostgres(durable=False) as server:
        await upgrade(server.url)
        yield server.url


async def test_the_last_admin_token_that_can_write_is_not_revoked(
    empty_database: str, bus_url: str, nats_auth: NatsAuth
) -> None:
    """Revoking the bootstrap token before issuing one's own (or the last admin token) left
    no one able to issue tokens again: the bootstrap token never comes back, so only a hand
    edit of the database could. A read-only admin token does not count."""
    async with api_started(empty_database, bus_url, SECRET, nats_auth) as api:
        (bootstrap,) = (await api.get("/v1/tokens", headers=auth(SECRET))).json()
        refused = await api.delete(f"/v1/tokens/{bootstrap['id']}", headers=auth(SECRET))
        assert refused.status_code == 409
        assert "last admin token" in refused.json()["detail"]
        reader = {"name": "look", "tenant": "ops", "role": "admin", "scope": "read"}
        await api.post("/v1/tokens", json=reader, headers=auth(SECRET))
        refused = await api.delete(f"/v1/tokens/{bootstrap['id']}", headers=auth(SECRET))
        assert refused.status_code == 409
        writer = {"name": "ops", "tenant": "ops", "role": "admin"}
        ops = (await api.post("/v1/tokens", json=writer, headers=auth(SECRET))).json()
        revoked = await api.delete(f"/v1/tokens/{bootstrap['id']}", headers=auth(ops["token"]))
        assert revoked.status_code == 204
        refused = await api.delete(f"/v1/tokens/{ops['id']}", headers=auth(ops["token"]))
        assert refused.status_code == 409
