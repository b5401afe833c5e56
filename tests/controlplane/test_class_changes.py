"""Classes changed and deleted over REST (`PATCH`/`DELETE /v1/classes/{name}`): what may
change, that a change reaches the class's claims already there, and that a class claims
not yet ended name is never deleted from under them (retirement: test_class_retirement)."""

# ruff: noqa: F811 (the fixture api_url, imported, is a parameter of the tests)
from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.cli import main
from tests.controlplane.conftest import ADMIN_TOKEN, Claim, Register, auth
from tests.controlplane.test_cli import api_url  # noqa: F401 (the server the CLI calls)

ADMIN = auth(ADMIN_TOKEN)


async def _new_class(api: httpx.AsyncClient, **fields: Any) -> str:
    """A class of its own for each test (classes outlive tests), made over REST."""
    name = f"c-{uuid.uuid4().hex[:10]}"
    body = {"name": name, "provisioner": "qshare"} | fields
    assert (await api.post("/v1/classes", json=body, headers=ADMIN)).status_code == 201
    return name


async def _listed(api: httpx.AsyncClient, name: str) -> dict[str, Any] | None:
    found = (await api.get("/v1/classes", headers=ADMIN)).json()
    return next((c for c in found if c["name"] == name), None)


def _fields(response: httpx.Response) -> list[str]:
    return [e["field"] for e in response.json().get("errors", [])]


async def test_a_patch_changes_the_fields_given_and_keeps_the_others(
    api: httpx.AsyncClient,
) -> None:
    name = await _new_class(api, description="before", eviction_grace_s=5)
    change = {"eviction_grace_s": 60, "starvation_share": 0.25}
    response = await api.patch(f"/v1/classes/{name}", json=change, headers=ADMIN)
    assert response.status_code == 200, response.text
    assert response.json()["eviction_grace_s"] == 60
    assert await _listed(api, name) == response.json()
    assert response.json()["description"] == "before"
    assert response.json()["starvation_share"] == 0.25


async def test_a_class_read_with_get_may_be_sent_back_whole(api: httpx.AsyncClient) -> None:
    name = await _new_class(api)
    whole = await _listed(api, name)
    assert whole is not None
    response = await api.patch(f"/v1/classes/{name}", json=whole | {"evictable": False},
                               headers=ADMIN)  # fmt: skip
    assert response.status_code == 200, response.text
    assert response.json() == whole | {"evictable": False}


async def test_name_and_provisioner_never_change(api: httpx.AsyncClient) -> None:
    name = await _new_class(api)
    for field, value in (("provisioner", "whole"), ("name", "another")):
        response = await api.patch(f"/v1/classes/{name}", json={field: value}, headers=ADMIN)
        assert response.status_code == 422, response.text
        assert _fields(response) == [field]
    assert (await _listed(api, name) or {}).get("provisioner") == "qshare"


async def test_bad_changes_are_422_naming_the_field(api: httpx.AsyncClient) -> None:
    name = await _new_class(api)
    bad = {"evictable": None, "eviction_grace_s": -1, "starvation_share": 2, "colour": "red",
           "description": "\x00"}  # fmt: skip
    for field, value in bad.items():
        response = await api.patch(f"/v1/classes/{name}", json={field: value}, headers=ADMIN)
        assert response.status_code == 422, (field, response.text)
        assert _fields(response) == [field], response.text


async def test_an_unknown_class_is_404_and_a_tenant_may_not_change_one(
    api: httpx.AsyncClient, tenant_tokens: dict[str, str]
) -> None:
    for method in ("PATCH", "DELETE"):
        body = {"evictable": False} if method == "PATCH" else None
        response = await api.request(method, "/v1/classes/no-such-class", json=body,
                                     headers=ADMIN)  # fmt: skip
        assert response.status_code == 404, response.text
        assert "no-such-class" in response.json()["detail"]
    tenant = auth(tenant_tokens["team-a"])
    name = await _new_class(api)
    assert (await api.patch(f"/v1/classes/{name}", json={}, headers=tenant)).status_code == 403
    assert (await api.delete(f"/v1/classes/{name}", headers=tenant)).status_code == 403


async def test_an_unused_class_is_deleted(api: httpx.AsyncClient) -> None:
    name = await _new_class(api)
    assert (await api.delete(f"/v1/classes/{name}", headers=ADMIN)).status_code == 204
    assert await _listed(api, name) is None
    assert (await api.delete(f"/v1/classes/{name}", headers=ADMIN)).status_code == 404


async def test_the_built_in_classes_are_not_deleted(api: httpx.AsyncClient) -> None:
    for name in ("qshare", "whole"):
        response = await api.delete(f"/v1/classes/{name}", headers=ADMIN)
        assert response.status_code == 409, response.text
        assert "built in" in response.json()["detail"]


async def test_a_class_claims_not_yet_ended_name_is_refused_with_their_count(
    api: httpx.AsyncClient, engine: AsyncEngine, register: Register, claim: Claim
) -> None:
    """The released claim is not counted: only it would have the class retired
    (test_class_retirement)."""
    name = await _new_class(api)
    await register("cls-1", cards=1)
    placed = await claim(priority="low", class_name=name, vmemory="12Gi")
    await claim(priority="low", class_name=name, vmemory="12Gi")  # waits: the card is taken
    async with engine.begin() as conn:  # a released claim is a record that keeps its class
        await conn.execute(text("UPDATE claims SET status = 'released' WHERE id = :id"),
                           {"id": placed.id})  # fmt: skip
    response = await api.delete(f"/v1/classes/{name}", headers=ADMIN)
    assert response.status_code == 409, response.text
    assert "named by 1 claims not yet ended (1 pending)" in response.json()["detail"]
    assert await _listed(api, name) is not None


async def test_a_change_reaches_the_class_claims_already_placed(
    api: httpx.AsyncClient, engine: AsyncEngine, register: Register, claim: Claim
) -> None:
    """A low-priority claim placed while its class was evictable is no longer evicted for a
    high-priority claim once the class says it is not."""
    name = await _new_class(api, eviction_grace_s=1)
    await register("cls-2", cards=1, memory="16Gi")
    low = await claim("team-a", priority="low", vmemory="12Gi", class_name=name)
    change = await api.patch(f"/v1/classes/{name}", json={"evictable": False}, headers=ADMIN)
    assert change.status_code == 200, change.text
    high = await claim("team-b", priority="high", vmemory="8Gi")
    assert high.status.value == "pending", high
    async with engine.connect() as conn:
        evict_at = await conn.execute(text("SELECT evict_at FROM claims WHERE id = :id"),
                                      {"id": low.id})  # fmt: skip
        assert evict_at.scalar_one() is None


async def test_a_claim_naming_a_deleted_class_is_refused_naming_class_name(
    api: httpx.AsyncClient, register: Register, claim: Claim
) -> None:
    """Also on an allocator that read the class before it was deleted (claims refused for
    their size after the class was looked up, on every replica)."""
    name = await _new_class(api)
    await register("cls-3", cards=1, memory="16Gi")
    for _ in range(8):
        refused = await api.post("/v1/claims", headers=ADMIN, json={
            "priority": "low", "vcore": 10, "vmemory": "64Gi", "class_name": name})  # fmt: skip
        assert refused.status_code == 422 and _fields(refused) == ["vmemory"], refused.text
    assert (await api.delete(f"/v1/classes/{name}", headers=ADMIN)).status_code == 204
    for _ in range(4):
        response = await api.post("/v1/claims", headers=ADMIN, json={
            "priority": "low", "vcore": 10, "vmemory": "1Gi", "class_name": name})  # fmt: skip
        assert response.status_code == 422, response.text
        assert _fields(response) == ["class_name"], response.text


async def _qshare(url: str, *args: str) -> int:
    group, *rest = args
    return await asyncio.to_thread(main, [group, "--url", url, "--token", ADMIN_TOKEN, *rest])


async def test_the_cli_sets_only_the_options_given_and_deletes(
    api: httpx.AsyncClient, api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    name = await _new_class(api, description="kept", starvation_share=0.1)
    args = ("set", name, "--grace", "45", "--evictable", "no")
    assert await _qshare(api_url, "classes", *args) == 0
    _, row = capsys.readouterr().out.splitlines()
    assert row.split() == [name, "qshare", "no", "45s", "yes", "10%", "no", "kept"]
    assert await _qshare(api_url, "classes", "delete", name) == 0
    assert capsys.readouterr().out.strip() == f"class {name} deleted"
    assert await _listed(api, name) is None


async def test_the_cli_names_its_option_when_the_api_refuses_a_value(
    api: httpx.AsyncClient, api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    name = await _new_class(api)
    assert await _qshare(api_url, "classes", "set", name, "--grace", "-3") == 1
    assert "--grace:" in capsys.readouterr().err
    assert await _qshare(api_url, "classes", "set", name) == 2
    assert "give at least one of" in capsys.readouterr().err
    assert await _qshare(api_url, "classes", "delete", "qshare") == 1
    assert "built in" in capsys.readouterr().err


async def test_the_cli_creates_a_class_with_the_options_given_and_defaults(
    api: httpx.AsyncClient, api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"c-{uuid.uuid4().hex[:10]}"
    args = ("create", name, "--grace", "45", "--evictable", "no", "--description", "made")
    assert await _qshare(api_url, "classes", *args) == 0
    _, row = capsys.readouterr().out.splitlines()
    assert row.split() == [name, "qshare", "no", "45s", "yes", "off", "no", "made"]
    made = await _listed(api, name)
    assert made is not None and (made["replace_on_failure"], made["starvation_share"]) == (
        True, 0.0)  # fmt: skip
    whole = ("create", f"{name}-w", "--provisioner", "whole", "--starvation-share", "0.25")
    assert await _qshare(api_url, "classes", *whole) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[:6] == [
        f"{name}-w", "whole", "yes", "30s", "yes", "25%"]  # fmt: skip


async def test_the_cli_create_names_the_option_of_a_bad_value(
    api: httpx.AsyncClient, api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"c-{uuid.uuid4().hex[:10]}"
    assert await _qshare(api_url, "classes", "create", name, "--starvation-share", "2") == 1
    assert "--starvation-share:" in capsys.readouterr().err
    for option, value in (("--grace", "nan"), ("--grace", "soon"), ("--provisioner", "mig")):
        with pytest.raises(SystemExit):
            await _qshare(api_url, "classes", "create", name, option, value)
        assert f"argument {option}:" in capsys.readouterr().err
    assert await _qshare(api_url, "classes", "create", "Not_A_Name") == 1
    assert "  NAME: " in capsys.readouterr().err  # the positional, as the usage line names it
    assert await _listed(api, name) is None
    assert await _qshare(api_url, "classes", "create", "qshare") == 1
    assert "class qshare exists" in capsys.readouterr().err


async def test_the_cli_set_refuses_a_number_json_cannot_carry_naming_the_option(
    api: httpx.AsyncClient, api_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`inf` and `nan` read as floats but no JSON carries them (before: a traceback)."""
    name = await _new_class(api)
    for option, value in (("--grace", "inf"), ("--starvation-share", "nan")):
        with pytest.raises(SystemExit):
            await _qshare(api_url, "classes", "set", name, option, value)
        assert f"argument {option}: {value!r} is not a number" in capsys.readouterr().err
