"""`GET /v1/classes/{name}` and `qshare classes get NAME`: one class as the list shows it,
for any token; a name no class has, or a retired class's, is a 404 naming it."""

from __future__ import annotations

import uuid

import httpx
import pytest
from sqlalchemy import func, update
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.contracts.schema import classes
from tests.controlplane.conftest import ADMIN_TOKEN, auth
from tests.controlplane.test_class_changes import _listed, _new_class
from tests.controlplane.test_cli import _qshare, api_url

__all__ = ["api_url"]  # the module's API server, as a fixture
ADMIN = auth(ADMIN_TOKEN)


async def test_a_class_is_shown_as_the_list_shows_it(api: httpx.AsyncClient) -> None:
    name = await _new_class(api, eviction_grace_s=60, description="batch")
    found = await api.get(f"/v1/classes/{name}", headers=ADMIN)
    assert found.status_code == 200 and found.json() == await _listed(api, name)


async def test_a_tenant_token_reads_a_class(api: httpx.AsyncClient) -> None:
    body = {"name": "class reader", "tenant": "team-c", "role": "tenant"}
    secret = (await api.post("/v1/tokens", json=body, headers=ADMIN)).json()["token"]
    assert (await api.get("/v1/classes/qshare", headers=auth(secret))).status_code == 200


async def test_an_unknown_class_is_a_404_naming_it(api: httpx.AsyncClient) -> None:
    missing = await api.get("/v1/classes/no-such-class", headers=ADMIN)
    assert missing.status_code == 404 and "no-such-class" in missing.json()["detail"]


async def test_a_retired_class_is_a_404(api: httpx.AsyncClient, engine: AsyncEngine) -> None:
    name = await _new_class(api)
    async with engine.begin() as conn:  # as a DELETE of a class ended claims name leaves it
        retire = update(classes).where(classes.c.name == name).values(retired_at=func.now())
        await conn.execute(retire)
    assert (await api.get(f"/v1/classes/{name}", headers=ADMIN)).status_code == 404


async def test_the_cli_shows_one_class(
    api_url: str, api: httpx.AsyncClient, capsys: pytest.CaptureFixture[str]
) -> None:
    name = await _new_class(api, description=f"d-{uuid.uuid4().hex[:6]}")
    assert await _qshare(api_url, "classes", "get", name) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[0] == "NAME" and row.split()[0] == name
