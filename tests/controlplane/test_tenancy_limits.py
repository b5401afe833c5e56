"""Quotas, token expiry and scopes, the rate limit, and idempotency keys that must name the
same request (issue 11)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.natsauth import NatsAuth, ServiceRole
from qshare_api.app import create_app
from qshare_api.settings import ApiSettings
from tests.controlplane.conftest import ADMIN_TOKEN, RULES, Register, as_identity, auth

ADMIN = auth(ADMIN_TOKEN)
GOOD = {"priority": "high", "vcore": 10, "vmemory": "2Gi"}


@pytest.fixture
def team_a(tenant_tokens: dict[str, str]) -> dict[str, str]:
    return auth(tenant_tokens["team-a"])


async def _issue(api: httpx.AsyncClient, **fields: object) -> dict[str, str]:
    body = {"name": "limited", "tenant": "team-a"} | fields
    response = await api.post("/v1/tokens", json=body, headers=ADMIN)
    assert response.status_code == 201, response.text
    return auth(response.json()["token"])


async def test_an_expired_token_is_401(api: httpx.AsyncClient, engine: AsyncEngine) -> None:
    token = await _issue(api, expires_in_s=3600)
    assert (await api.get("/v1/claims", headers=token)).status_code == 200
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE tokens SET expires_at = now() WHERE name = 'limited'"))
    response = await api.get("/v1/claims", headers=token)
    assert (response.status_code, response.json()["detail"]) == (401, "token expired")


async def test_a_read_only_token_reads_but_cannot_write(api: httpx.AsyncClient) -> None:
    token = await _issue(api, scope="read")
    assert (await api.get("/v1/claims", headers=token)).status_code == 200
    assert (await api.post("/v1/claims", json=GOOD, headers=token)).status_code == 403


async def test_a_token_lifetime_below_a_minute_is_invalid(api: httpx.AsyncClient) -> None:
    body = {"name": "x", "tenant": "t", "expires_in_s": 5}
    response = await api.post("/v1/tokens", json=body, headers=ADMIN)
    assert [e["field"] for e in response.json()["errors"]] == ["expires_in_s"]


@pytest.fixture
async def strict_api(
    database_url: str, bus_url: str, nats_auth: NatsAuth, replicas: object
) -> AsyncIterator[httpx.AsyncClient]:
    """An API process allowing each token 1 request/s in bursts of 2."""
    settings = ApiSettings(
        database_url=database_url, nats_url=bus_url, cluster=RULES, rate_limit_per_s=1,
        rate_limit_burst=2, **as_identity(nats_auth, ServiceRole.API),
    )  # fmt: skip
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            yield client


async def test_a_token_over_its_rate_gets_429_with_retry_after(
    strict_api: httpx.AsyncClient, team_a: dict[str, str]
) -> None:
    statuses = [(await strict_api.get("/v1/claims", headers=team_a)).status_code for _ in range(3)]
    limited = await strict_api.get("/v1/claims", headers=team_a)
    assert statuses[:2] == [200, 200]
    assert limited.status_code == 429
    assert int(limited.headers["retry-after"]) >= 1
    assert (await strict_api.get("/v1/claims", headers=ADMIN)).status_code == 200


async def _quota(api: httpx.AsyncClient, **limits: object) -> None:
    response = await api.put("/v1/quotas/team-a", json=limits, headers=ADMIN)
    assert response.status_code == 200, response.text


async def test_a_claim_past_the_memory_quota_is_409_naming_vmemory(
    api: httpx.AsyncClient, register: Register, team_a: dict[str, str]
) -> None:
    await register("n1", cards=2, memory="80Gi")
    await _quota(api, memory="4Gi")
    for _ in range(2):
        assert (await api.post("/v1/claims", json=GOOD, headers=team_a)).status_code == 201
    refused = await api.post("/v1/claims", json=GOOD, headers=team_a)
    assert refused.status_code == 409
    assert [e["field"] for e in refused.json()["errors"]] == ["vmemory"]


async def test_a_memory_quota_refusal_gives_sizes_in_readable_units(
    api: httpx.AsyncClient, register: Register, team_a: dict[str, str]
) -> None:
    await register("n1", cards=2, memory="80Gi")
    await _quota(api, memory="3Gi")
    assert (await api.post("/v1/claims", json=GOOD, headers=team_a)).status_code == 201
    half = GOOD | {"vmemory": "1536Mi"}
    refused = (await api.post("/v1/claims", json=half, headers=team_a)).json()
    assert refused["errors"][0]["message"] == "quota of 3 GiB exceeded (3.5 GiB with this)"


async def test_a_resize_past_the_memory_quota_is_409_naming_vmemory(
    api: httpx.AsyncClient, register: Register, team_a: dict[str, str]
) -> None:
    await register("n1", cards=2, memory="80Gi")
    await _quota(api, memory="4Gi")
    claim = (await api.post("/v1/claims", json=GOOD, headers=team_a)).json()
    grown = await api.patch(f"/v1/claims/{claim['id']}", json={"vmemory": "6Gi"}, headers=team_a)
    assert grown.status_code == 409
    assert [e["field"] for e in grown.json()["errors"]] == ["vmemory"]
    shrunk = await api.patch(f"/v1/claims/{claim['id']}", json={"vmemory": "1Gi"}, headers=team_a)
    assert shrunk.status_code == 200


async def test_a_read_only_token_cannot_resize(api: httpx.AsyncClient) -> None:
    token = await _issue(api, scope="read")
    resize = await api.patch(f"/v1/claims/{uuid.uuid4()}", json={"vcore": 5}, headers=token)
    assert resize.status_code == 403


async def test_a_released_claim_no_longer_counts_against_the_quota(
    api: httpx.AsyncClient, register: Register, team_a: dict[str, str]
) -> None:
    await register("n1")
    await _quota(api, cards=1)
    first = (await api.post("/v1/claims", json=GOOD, headers=team_a)).json()
    assert (await api.post("/v1/claims", json=GOOD, headers=team_a)).status_code == 409
    await api.delete(f"/v1/claims/{first['id']}", headers=team_a)
    assert (await api.post("/v1/claims", json=GOOD, headers=team_a)).status_code == 201


async def test_pending_claims_are_limited(api: httpx.AsyncClient, team_a: dict[str, str]) -> None:
    await _quota(api, pending=1)
    assert (await api.post("/v1/claims", json=GOOD, headers=team_a)).json()["status"] == "pending"
    refused = await api.post("/v1/claims", json=GOOD, headers=team_a)
    assert [e["field"] for e in refused.json()["errors"]] == ["pending"]


async def test_another_tenant_is_not_limited_by_a_quota(
    api: httpx.AsyncClient, tenant_tokens: dict[str, str]
) -> None:
    await _quota(api, pending=0)
    team_b = auth(tenant_tokens["team-b"])
    assert (await api.post("/v1/claims", json=GOOD, headers=team_b)).status_code == 201


async def test_a_reused_idempotency_key_with_another_request_is_409_naming_the_difference(
    api: httpx.AsyncClient, register: Register, team_a: dict[str, str]
) -> None:
    await register("n1")
    body = GOOD | {"idempotency_key": "job-7"}
    assert (await api.post("/v1/claims", json=body, headers=team_a)).status_code == 201
    again = await api.post("/v1/claims", json=body | {"priority": "low"}, headers=team_a)
    assert again.status_code == 409
    assert [e["field"] for e in again.json()["errors"]] == ["priority"]
    assert (await api.post("/v1/claims", json=body, headers=team_a)).status_code == 200


async def test_a_reused_idempotency_key_with_another_gang_is_409_naming_the_gang(
    api: httpx.AsyncClient, register: Register, team_a: dict[str, str]
) -> None:
    await register("n1")
    body = GOOD | {"priority": "low", "idempotency_key": "job-8", "gang": "train"}
    assert (await api.post("/v1/claims", json=body, headers=team_a)).status_code == 201
    again = await api.post("/v1/claims", json=body | {"gang": "eval"}, headers=team_a)
    assert again.status_code == 409, again.text
    assert [e["field"] for e in again.json()["errors"]] == ["gang"]


async def test_a_claim_placed_at_once_is_not_held_to_the_pending_limit(
    api: httpx.AsyncClient, register: Register, team_a: dict[str, str]
) -> None:
    await register("n1")
    await _quota(api, pending=0)
    response = await api.post("/v1/claims", json=GOOD, headers=team_a)
    assert response.status_code == 201, response.text
    assert response.json()["status"] == "placed"
