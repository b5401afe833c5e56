"""Changing a quota: PATCH changes only the limits it names (`null` removes one) and keeps the
others; PUT still sets the whole quota (a limit it leaves out is no limit)."""

from __future__ import annotations

import asyncio

import httpx

from tests.controlplane.conftest import ADMIN_TOKEN, auth

ADMIN = auth(ADMIN_TOKEN)


async def _quota(api: httpx.AsyncClient, tenant: str) -> dict[str, object]:
    quotas = (await api.get("/v1/quotas", headers=ADMIN)).json()
    return next(q for q in quotas if q["tenant"] == tenant)


async def _tenants(api: httpx.AsyncClient) -> set[str]:
    """The tenants that have a quota."""
    return {q["tenant"] for q in (await api.get("/v1/quotas", headers=ADMIN)).json()}


async def test_a_patch_changes_only_the_limits_it_names(api: httpx.AsyncClient) -> None:
    await api.put("/v1/quotas/t-p", json={"memory": "8Gi", "cards": 4}, headers=ADMIN)
    changed = await api.patch("/v1/quotas/t-p", json={"pending": 2}, headers=ADMIN)
    assert changed.status_code == 200
    expected = {"tenant": "t-p", "memory_mib": 8192, "cards": 4, "pending": 2}
    assert changed.json() == expected
    assert await _quota(api, "t-p") == expected


async def test_a_patch_with_null_removes_that_limit(api: httpx.AsyncClient) -> None:
    await api.put("/v1/quotas/t-n", json={"memory": "8Gi", "cards": 4}, headers=ADMIN)
    changed = await api.patch("/v1/quotas/t-n", json={"cards": None}, headers=ADMIN)
    assert changed.json() == {"tenant": "t-n", "memory_mib": 8192, "cards": None, "pending": None}


async def test_a_patch_gives_a_tenant_without_a_quota_one(api: httpx.AsyncClient) -> None:
    changed = await api.patch("/v1/quotas/t-new", json={"cards": 3}, headers=ADMIN)
    assert changed.json() == {"tenant": "t-new", "memory_mib": None, "cards": 3, "pending": None}


async def test_an_empty_patch_of_a_tenant_without_a_quota_is_404_naming_it(
    api: httpx.AsyncClient,
) -> None:
    refused = await api.patch("/v1/quotas/t-none", json={}, headers=ADMIN)
    assert refused.status_code == 404
    assert "t-none" in refused.json()["detail"]
    assert "t-none" not in await _tenants(api)


async def test_an_empty_patch_of_a_quota_changes_nothing_and_returns_it(
    api: httpx.AsyncClient,
) -> None:
    await api.put("/v1/quotas/t-e", json={"memory": "8Gi", "pending": 2}, headers=ADMIN)
    kept = await api.patch("/v1/quotas/t-e", json={}, headers=ADMIN)
    expected = {"tenant": "t-e", "memory_mib": 8192, "cards": None, "pending": 2}
    assert (kept.status_code, kept.json()) == (200, expected)
    assert await _quota(api, "t-e") == expected


async def test_a_patch_only_removing_limits_of_a_tenant_without_a_quota_is_404_naming_it(
    api: httpx.AsyncClient,
) -> None:
    """`{"cards": null}` (`qshare quotas set T --cards none`) has no limit to remove there:
    like `{}`, it never creates an empty quota."""
    refused = await api.patch("/v1/quotas/t-nulls", json={"cards": None}, headers=ADMIN)
    assert refused.status_code == 404
    assert "t-nulls" in refused.json()["detail"]
    assert "t-nulls" not in await _tenants(api)


async def test_a_put_still_sets_the_whole_quota(api: httpx.AsyncClient) -> None:
    await api.put("/v1/quotas/t-w", json={"memory": "8Gi", "cards": 4}, headers=ADMIN)
    await api.put("/v1/quotas/t-w", json={"pending": 1}, headers=ADMIN)
    assert await _quota(api, "t-w") == {
        "tenant": "t-w", "memory_mib": None, "cards": None, "pending": 1
    }  # fmt: skip


async def test_a_patch_with_a_bad_limit_is_422_naming_it(api: httpx.AsyncClient) -> None:
    refused = await api.patch("/v1/quotas/t-b", json={"cards": -1}, headers=ADMIN)
    assert refused.status_code == 422
    assert [e["field"] for e in refused.json()["errors"]] == ["cards"]


async def test_patches_of_different_limits_at_once_lose_neither(api: httpx.AsyncClient) -> None:
    patches = [{"cards": 3}, {"pending": 5}, {"memory": "4Gi"}] * 4
    answers = await asyncio.gather(
        *(api.patch("/v1/quotas/t-race", json=body, headers=ADMIN) for body in patches)
    )
    assert {a.status_code for a in answers} == {200}
    assert await _quota(api, "t-race") == {
        "tenant": "t-race", "memory_mib": 4096, "cards": 3, "pending": 5
    }  # fmt: skip
