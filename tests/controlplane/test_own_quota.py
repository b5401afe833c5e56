"""`GET /v1/me/quota`: a tenant reads its own quota and usage, never another's; and
`GET /v1/preemptions?kind=` filters by kind, refusing an unknown one."""

from __future__ import annotations

import uuid

import httpx
import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.contracts.schema import preemptions
from tests.controlplane.conftest import ADMIN_TOKEN, Register, auth

ADMIN = auth(ADMIN_TOKEN)
GOOD = {"priority": "high", "vcore": 10, "vmemory": "2Gi"}


@pytest.fixture
def team_a(tenant_tokens: dict[str, str]) -> dict[str, str]:
    return auth(tenant_tokens["team-a"])


async def test_a_tenant_reads_its_own_quota_and_usage(
    api: httpx.AsyncClient, register: Register, team_a: dict[str, str]
) -> None:
    await register("n1", cards=2, memory="80Gi")
    await api.put("/v1/quotas/team-a", json={"memory": "8Gi", "cards": 4}, headers=ADMIN)
    assert (await api.post("/v1/claims", json=GOOD, headers=team_a)).status_code == 201
    mine = (await api.get("/v1/me/quota", headers=team_a)).json()
    assert mine == {"tenant": "team-a", "memory_mib": 8192, "cards": 4, "pending": None,
                    "usage": {"memory_mib": 2048, "cards": 1, "pending": 0}}  # fmt: skip


async def test_a_tenant_without_a_quota_reads_no_limits(
    api: httpx.AsyncClient, team_a: dict[str, str]
) -> None:
    mine = (await api.get("/v1/me/quota", headers=team_a)).json()
    assert (mine["memory_mib"], mine["cards"], mine["pending"]) == (None, None, None)
    assert mine["usage"] == {"memory_mib": 0, "cards": 0, "pending": 0}


async def test_a_tenant_never_reads_another_tenants_quota(
    api: httpx.AsyncClient, team_a: dict[str, str]
) -> None:
    await api.put("/v1/quotas/team-b", json={"cards": 1}, headers=ADMIN)
    response = await api.get("/v1/me/quota", params={"tenant": "team-b"}, headers=team_a)
    assert response.status_code == 403


async def test_an_admin_reads_any_tenants_quota(api: httpx.AsyncClient) -> None:
    await api.put("/v1/quotas/team-b", json={"cards": 1}, headers=ADMIN)
    response = await api.get("/v1/me/quota", params={"tenant": "team-b"}, headers=ADMIN)
    assert (response.json()["tenant"], response.json()["cards"]) == ("team-b", 1)


async def test_preemptions_of_an_unknown_kind_are_a_422_naming_kind(
    api: httpx.AsyncClient,
) -> None:
    response = await api.get("/v1/preemptions", params={"kind": "nap"}, headers=ADMIN)
    assert response.status_code == 422
    assert [e["field"] for e in response.json()["errors"]] == ["kind"]


async def test_preemptions_filtered_by_kind_list_only_that_kind(
    api: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    claim = uuid.uuid4()
    rows = [{"claim_id": claim, "tenant": "team-a", "kind": k, "reason": "test"}
            for k in ("gang", "operator", "eviction")]  # fmt: skip
    async with engine.begin() as conn:
        await conn.execute(insert(preemptions), rows)
    params = {"claim": str(claim), "kind": "operator"}
    listed = (await api.get("/v1/preemptions", params=params, headers=ADMIN)).json()
    assert [p["kind"] for p in listed] == ["operator"]
