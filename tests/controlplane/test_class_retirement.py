"""Deleting a class that claims have named (`DELETE /v1/classes/{name}`): once every one of
its claims has ended it is retired, not deleted (the ended claims keep naming it), and a
retired class is neither listed, changed nor named by new claims until added again."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.controlplane.conftest import ADMIN_TOKEN, Claim, Register, auth
from tests.controlplane.test_class_changes import _listed, _new_class

ADMIN = auth(ADMIN_TOKEN)


async def _end(engine: AsyncEngine, claim_id: uuid.UUID, status: str) -> None:
    """End a claim as its release (or failure) would have."""
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE claims SET status = :s WHERE id = :id"),
                           {"s": status, "id": claim_id})  # fmt: skip


async def _used_then_ended(api: httpx.AsyncClient, engine: AsyncEngine, register: Register,
                           claim: Claim, **fields: Any) -> tuple[str, list[uuid.UUID]]:  # fmt: skip
    """A class two claims named, one released and one failed since."""
    name = await _new_class(api, **fields)
    await register(f"ret-{name}", cards=1)
    ids = [(await claim(priority="low", class_name=name, vmemory="4Gi")).id for _ in range(2)]
    await _end(engine, ids[0], "released")
    await _end(engine, ids[1], "failed")
    return name, ids


async def _post_claim(api: httpx.AsyncClient, name: str, vmemory: str = "1Gi") -> httpx.Response:
    body = {"priority": "low", "vcore": 10, "vmemory": vmemory, "class_name": name}
    return await api.post("/v1/claims", headers=ADMIN, json=body)


def _fields(response: httpx.Response) -> list[str]:
    return [e["field"] for e in response.json().get("errors", [])]


async def test_a_class_whose_claims_have_all_ended_is_retired_on_delete(
    api: httpx.AsyncClient, engine: AsyncEngine, register: Register, claim: Claim
) -> None:
    name, _ = await _used_then_ended(api, engine, register, claim)
    response = await api.delete(f"/v1/classes/{name}", headers=ADMIN)
    assert response.status_code == 204, response.text
    assert await _listed(api, name) is None
    async with engine.connect() as conn:
        query = text("SELECT retired_at IS NOT NULL FROM classes WHERE name = :n")
        assert (await conn.execute(query, {"n": name})).scalar_one() is True


async def test_ended_claims_keep_naming_their_retired_class(
    api: httpx.AsyncClient, engine: AsyncEngine, register: Register, claim: Claim,
    tenant_tokens: dict[str, str],
) -> None:  # fmt: skip
    name, ids = await _used_then_ended(api, engine, register, claim)
    assert (await api.delete(f"/v1/classes/{name}", headers=ADMIN)).status_code == 204
    tenant = auth(tenant_tokens["team-a"])
    released = await api.get("/v1/claims", params={"status": "released"}, headers=tenant)
    assert released.status_code == 200, released.text
    shown = {c["id"]: c["class_name"] for c in released.json()["items"]}
    assert shown.get(str(ids[0])) == name, released.text
    failed = await api.get(f"/v1/claims/{ids[1]}", headers=tenant)
    assert failed.status_code == 200 and failed.json()["class_name"] == name, failed.text


async def test_a_retired_class_is_refused_to_new_claims_naming_class_name(
    api: httpx.AsyncClient, engine: AsyncEngine, register: Register, claim: Claim
) -> None:
    """Also on allocators that read the class before it was retired (claims refused for
    their size after the class was looked up, on every replica)."""
    name, _ = await _used_then_ended(api, engine, register, claim)
    for _ in range(8):
        refused = await _post_claim(api, name, vmemory="64Gi")
        assert refused.status_code == 422 and _fields(refused) == ["vmemory"], refused.text
    assert (await api.delete(f"/v1/classes/{name}", headers=ADMIN)).status_code == 204
    for _ in range(4):
        response = await _post_claim(api, name)
        assert response.status_code == 422, response.text
        assert _fields(response) == ["class_name"] and "retired" in response.text


async def test_a_retired_class_is_not_changed_or_deleted_again(
    api: httpx.AsyncClient, engine: AsyncEngine, register: Register, claim: Claim
) -> None:
    name, _ = await _used_then_ended(api, engine, register, claim)
    assert (await api.delete(f"/v1/classes/{name}", headers=ADMIN)).status_code == 204
    change = await api.patch(f"/v1/classes/{name}", json={"evictable": False}, headers=ADMIN)
    assert change.status_code == 404 and name in change.json()["detail"], change.text
    again = await api.delete(f"/v1/classes/{name}", headers=ADMIN)
    assert again.status_code == 404 and name in again.json()["detail"], again.text


async def test_a_class_claims_not_yet_ended_name_is_409_with_their_count(
    api: httpx.AsyncClient, engine: AsyncEngine, register: Register, claim: Claim
) -> None:
    """Each status not ended counts (pending, placed, releasing here); ended ones do not."""
    name, _ = await _used_then_ended(api, engine, register, claim)
    live = [(await claim(priority="low", class_name=name, vmemory="4Gi")).id for _ in range(3)]
    await _end(engine, live[0], "pending")
    await _end(engine, live[2], "releasing")
    response = await api.delete(f"/v1/classes/{name}", headers=ADMIN)
    assert response.status_code == 409, response.text
    detail = response.json()["detail"]
    assert "named by 3 claims not yet ended (1 pending, 1 placed, 1 releasing)" in detail
    assert await _listed(api, name) is not None


async def test_adding_a_retired_name_brings_the_class_back_with_the_fields_given(
    api: httpx.AsyncClient, engine: AsyncEngine, register: Register, claim: Claim
) -> None:
    name, _ = await _used_then_ended(api, engine, register, claim, eviction_grace_s=5)
    assert (await api.delete(f"/v1/classes/{name}", headers=ADMIN)).status_code == 204
    body = {"name": name, "provisioner": "qshare", "eviction_grace_s": 90}
    added = await api.post("/v1/classes", json=body, headers=ADMIN)
    assert added.status_code == 201, added.text
    listed = await _listed(api, name)
    assert listed is not None and listed["eviction_grace_s"] == 90
    assert (await _post_claim(api, name)).status_code == 201
    again = await api.post("/v1/classes", json=body, headers=ADMIN)
    assert again.status_code == 409 and f"class {name} exists" in again.text


async def test_adding_a_retired_name_with_another_provisioner_is_409_naming_its_own(
    api: httpx.AsyncClient, engine: AsyncEngine, register: Register, claim: Claim
) -> None:
    name, _ = await _used_then_ended(api, engine, register, claim)
    assert (await api.delete(f"/v1/classes/{name}", headers=ADMIN)).status_code == 204
    body = {"name": name, "provisioner": "whole"}
    refused = await api.post("/v1/classes", json=body, headers=ADMIN)
    assert refused.status_code == 409, refused.text
    assert "retired" in refused.text and "provisioner qshare" in refused.text
    assert await _listed(api, name) is None
