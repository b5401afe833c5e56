"""`GET /v1/claims?tenant=`: a tenant may name itself (its own claims, as without the
filter), another tenant is a 403 saying only admins list other tenants' claims; an admin
lists one tenant's."""

from __future__ import annotations

import httpx

from tests.controlplane.conftest import ADMIN_TOKEN, Claim, Register, auth


async def _ids(api: httpx.AsyncClient, token: str, **params: str) -> list[str]:
    response = await api.get("/v1/claims", params=params, headers=auth(token))
    assert response.status_code == 200, response.text
    return [item["id"] for item in response.json()["items"]]


async def test_a_tenant_naming_itself_lists_its_own_claims(
    api: httpx.AsyncClient, register: Register, claim: Claim, tenant_tokens: dict[str, str]
) -> None:
    await register("n1", cards=2)
    mine = await claim("team-a")
    await claim("team-b")
    team_a = tenant_tokens["team-a"]
    assert await _ids(api, team_a, tenant="team-a") == [str(mine.id)]
    assert await _ids(api, team_a) == [str(mine.id)]


async def test_a_tenant_naming_another_is_a_403_saying_only_admins_may(
    api: httpx.AsyncClient, tenant_tokens: dict[str, str]
) -> None:
    response = await api.get(
        "/v1/claims", params={"tenant": "team-b"}, headers=auth(tenant_tokens["team-a"])
    )
    assert response.status_code == 403, response.text
    assert "only admins" in response.json()["detail"]
    assert "team-b" in response.json()["detail"]


async def test_an_admin_lists_one_tenants_claims(
    api: httpx.AsyncClient, register: Register, claim: Claim
) -> None:
    await register("n1", cards=2)
    await claim("team-a")
    theirs = await claim("team-b")
    assert await _ids(api, ADMIN_TOKEN, tenant="team-b") == [str(theirs.id)]
