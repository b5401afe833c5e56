"""The REST API's authentication edge: a malformed Authorization header is a 401 naming what
is wrong; failed authentications are limited per client address (X-Forwarded-For believed
only from trusted proxies), answered 429 before any token lookup once spent, while good
tokens from that address keep working; the limits' memory stays bounded."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import event

from qshare.contracts.errors import RateLimited
from qshare.natsauth import NatsAuth, ServiceRole
from qshare_api import ratelimit
from qshare_api.app import create_app
from qshare_api.failures import FailedAuth
from qshare_api.ratelimit import RateLimiter
from qshare_api.settings import ApiSettings
from tests.controlplane.conftest import ADMIN_TOKEN, RULES, as_identity, auth

ADMIN = auth(ADMIN_TOKEN)
BURST = 3
Serve = Callable[..., AbstractAsyncContextManager[FastAPI]]


@pytest.fixture
def serve(database_url: str, bus_url: str, nats_auth: NatsAuth, api: httpx.AsyncClient) -> Serve:
    """An API process of its own (the session's stored the admin token), with `changes` to
    its settings."""

    @asynccontextmanager
    async def go(**changes: Any) -> AsyncIterator[FastAPI]:
        fields: dict[str, Any] = {
            "database_url": database_url, "nats_url": bus_url, "cluster": RULES,
            "auth_failures_per_s": 0.01, "auth_failure_burst": BURST,
        } | as_identity(nats_auth, ServiceRole.API) | changes  # fmt: skip
        settings = ApiSettings(**fields)
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            yield app

    return go


@asynccontextmanager
async def client_at(app: FastAPI, address: str = "203.0.113.5") -> AsyncIterator[httpx.AsyncClient]:
    """A client whose connection comes from `address`."""
    transport = httpx.ASGITransport(app=app, client=(address, 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        yield client


@pytest.fixture
async def strict(serve: Serve) -> AsyncIterator[FastAPI]:
    """An API allowing each address 3 failed authentications, then one per 100 s."""
    async with serve() as app:
        yield app


@pytest.fixture
async def good_token(api: httpx.AsyncClient) -> dict[str, Any]:
    body = {"name": "auth-edge", "tenant": "team-a", "role": "tenant"}
    issued = (await api.post("/v1/tokens", json=body, headers=ADMIN)).json()
    return {"id": issued["id"], "headers": auth(issued["token"])}


@asynccontextmanager
async def token_lookups(app: FastAPI) -> AsyncIterator[list[str]]:
    """The statements reading the tokens table while the block runs."""
    seen: list[str] = []
    engine = app.state.resources.reader.sync_engine

    def count(conn: object, cursor: object, statement: str, *_: object) -> None:
        if "FROM tokens" in statement:
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", count)


async def _statuses(client: httpx.AsyncClient, n: int, **kwargs: Any) -> list[int]:
    return [(await client.get("/v1/claims", **kwargs)).status_code for _ in range(n)]


# -- a malformed Authorization header


@pytest.mark.parametrize(
    ("header", "named"),
    [
        (None, "missing Authorization header"),
        ("Basic dXNlcjpwdw==", "scheme 'Basic' is not Bearer"),
        ("Bearer", "no token after Bearer"),
        ("Bearer ", "no token after Bearer"),
        ("qs_forgot_the_scheme", "scheme 'qs_forgot_the_scheme' is not Bearer"),
        ("Bearer qs_a qs_b", "holds whitespace"),
        (b"Bearer qs_\xff\xfe", "unknown or revoked token"),
    ],
)
async def test_a_malformed_authorization_header_is_a_401_naming_the_problem(
    api: httpx.AsyncClient, header: str | bytes | None, named: str
) -> None:
    value = header.encode("latin-1") if isinstance(header, str) else header
    headers = [] if value is None else [(b"Authorization", value)]
    response = await api.get("/v1/claims", headers=headers)
    assert response.status_code == 401, response.text
    assert named in response.json()["detail"]
    assert response.headers["www-authenticate"] == "Bearer"


async def test_two_authorization_headers_are_a_401_naming_both(api: httpx.AsyncClient) -> None:
    headers = [("Authorization", f"Bearer {ADMIN_TOKEN}"), ("Authorization", "Bearer qs_x")]
    response = await api.get("/v1/claims", headers=headers)
    assert response.status_code == 401
    assert "2 Authorization headers" in response.json()["detail"]


async def test_the_scheme_is_case_insensitive(api: httpx.AsyncClient) -> None:
    headers = {"Authorization": f"bearer {ADMIN_TOKEN}"}
    assert (await api.get("/v1/claims", headers=headers)).status_code == 200


# -- failed authentications per client address


async def test_failures_past_the_burst_get_a_429_with_retry_after_and_no_lookup(
    strict: FastAPI,
) -> None:
    async with client_at(strict) as client, token_lookups(strict) as lookups:
        assert await _statuses(client, BURST, headers=auth("qs_guess")) == [401] * BURST
        refused = await client.get("/v1/claims", headers=auth("qs_another_guess"))
    assert refused.status_code == 429
    assert "failed authentications" in refused.json()["detail"]
    assert int(refused.headers["retry-after"]) == 100  # one failure per 100 s
    assert len(lookups) == BURST


async def test_a_good_token_from_a_refused_address_keeps_working(
    strict: FastAPI, good_token: dict[str, Any]
) -> None:
    async with client_at(strict) as client:
        assert await _statuses(client, 1, headers=good_token["headers"]) == [200]
        await _statuses(client, BURST + 1, headers=auth("qs_guess"))
        assert await _statuses(client, 5, headers=good_token["headers"]) == [200] * 5


async def test_good_tokens_spend_none_of_their_addresss_failures(
    strict: FastAPI, good_token: dict[str, Any]
) -> None:
    async with client_at(strict) as client:
        assert await _statuses(client, 10, headers=good_token["headers"]) == [200] * 10
        assert await _statuses(client, BURST, headers=auth("qs_guess")) == [401] * BURST


async def test_a_token_revoked_after_it_was_seen_good_counts_as_a_failure(
    strict: FastAPI, api: httpx.AsyncClient, good_token: dict[str, Any]
) -> None:
    async with client_at(strict) as client:
        assert await _statuses(client, 1, headers=good_token["headers"]) == [200]
        await api.delete(f"/v1/tokens/{good_token['id']}", headers=ADMIN)
        statuses = await _statuses(client, BURST + 1, headers=good_token["headers"])
    assert statuses == [401] * BURST + [429]


async def test_lookups_a_database_outage_failed_spend_no_failures(serve: Serve) -> None:
    gone = "postgresql+asyncpg://q:q@127.0.0.1:9/q"
    async with serve(database_url=gone) as app, client_at(app) as client:
        statuses = await _statuses(client, BURST + 2, headers=auth("qs_guess"))
    assert statuses == [503] * (BURST + 2)  # not refused as failures: none was found wrong


async def test_another_address_is_not_refused_for_ones_failures(strict: FastAPI) -> None:
    async with client_at(strict, "203.0.113.5") as one, client_at(strict, "203.0.113.6") as two:
        await _statuses(one, BURST + 1, headers=auth("qs_guess"))
        assert await _statuses(two, 1, headers=auth("qs_guess")) == [401]


async def test_addresses_of_one_ipv6_64_share_their_failures(strict: FastAPI) -> None:
    statuses = []
    for host in range(1, BURST + 2):
        async with client_at(strict, f"2001:db8:0:7::{host:x}") as client:
            statuses += await _statuses(client, 1, headers=auth("qs_guess"))
    assert statuses == [401] * BURST + [429]


async def test_x_forwarded_for_is_not_believed_from_an_untrusted_peer(strict: FastAPI) -> None:
    async with client_at(strict) as client:
        statuses = [
            (await client.get("/v1/claims", headers=auth("qs_guess") | {
                "X-Forwarded-For": f"198.51.100.{i}"})).status_code
            for i in range(BURST + 1)
        ]  # fmt: skip
    assert statuses == [401] * BURST + [429]


async def test_a_trusted_proxy_names_the_client_by_its_last_untrusted_hop(serve: Serve) -> None:
    async with serve(trusted_proxies="10.0.0.0/8") as app, client_at(app, "10.1.2.3") as proxy:

        async def via(forwarded: str) -> int:
            headers = auth("qs_guess") | {"X-Forwarded-For": forwarded}
            return (await proxy.get("/v1/claims", headers=headers)).status_code

        spoofed = [await via(f"192.0.2.{i}, 198.51.100.9, 10.9.9.9") for i in range(BURST + 1)]
        others = [await via(f"198.51.100.{i}") for i in range(10, 10 + BURST + 1)]
    assert spoofed == [401] * BURST + [429]  # the client wrote the first hop itself
    assert others == [401] * (BURST + 1)


def test_trusted_proxies_are_read_as_a_comma_separated_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("QSHARE_API_TRUSTED_PROXIES", "10.0.0.0/8, 192.168.1.7")
    assert [str(n) for n in ApiSettings().trusted_proxies] == ["10.0.0.0/8", "192.168.1.7/32"]


# -- bounds


def test_a_full_limiter_forgets_the_bucket_idle_longest_not_every_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ratelimit, "MAX_CALLERS", 2)
    limiter = RateLimiter(0.001, 2)
    limiter.take("idle")
    limiter.take("busy")
    limiter.take("busy")
    with pytest.raises(RateLimited):
        limiter.take("busy")
    limiter.take("new")
    with pytest.raises(RateLimited):
        limiter.take("busy")
    assert len(limiter) == 2


def test_failures_from_many_addresses_keep_bounded_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ratelimit, "MAX_CALLERS", 100)
    failures = FailedAuth(1.0, 5, [])
    for i in range(5000):
        address = failures.address({"client": (f"10.{i // 256}.{i % 256}.1", 1)})
        failures.failed("digest", address, failures.before_lookup("digest", address))
    assert len(failures.limiter) == 100


async def test_a_tokens_429_says_to_wait_as_long_as_its_rate_needs(serve: Serve) -> None:
    async with (
        serve(rate_limit_per_s=0.1, rate_limit_burst=1) as app,
        client_at(app) as client,
    ):
        assert await _statuses(client, 1, headers=ADMIN) == [200]
        limited = await client.get("/v1/claims", headers=ADMIN)
    assert limited.status_code == 429
    assert limited.headers["retry-after"] == "10"


def test_a_burst_of_one_lets_a_new_callers_first_request_through() -> None:
    RateLimiter(0.001, 1).take("first")
