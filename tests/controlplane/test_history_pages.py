"""`GET /v1/preemptions` and `GET /v1/starvation` page through the whole history, newest
first: `before=ID` lists the records older than record ID (the last of a page). Before, a
page held at most 500 records and nothing reached past them; records written in one
transaction (one `started_at`) came in no fixed order."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from sqlalchemy import Table, insert
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.contracts.schema import preemptions, starvations
from tests.controlplane.conftest import ADMIN_TOKEN, auth

ADMIN = auth(ADMIN_TOKEN)


def _record(table: Table, tenant: str) -> dict[str, Any]:
    row: dict[str, Any] = {"claim_id": uuid.uuid4(), "tenant": tenant}
    if table is preemptions:
        return row | {"kind": "operator", "reason": "test"}
    return row | {"gpu_uuid": "g", "node_name": "n", "share": 0.0, "harvestable_share": 0.0,
                  "window_s": 1.0}  # fmt: skip


async def _write(engine: AsyncEngine, table: Table, tenant: str, count: int) -> None:
    """`count` records in each of three transactions: ties of `started_at` within each."""
    for _ in range(3):
        async with engine.begin() as conn:
            await conn.execute(insert(table), [_record(table, tenant) for _ in range(count)])


async def _pages(api: httpx.AsyncClient, path: str, token: str, limit: int) -> list[list[int]]:
    pages: list[list[int]] = []
    params: dict[str, Any] = {"limit": limit}
    while True:
        response = await api.get(path, params=params, headers=auth(token))
        assert response.status_code == 200, response.text
        page = [r["id"] for r in response.json()]
        if not page:
            return pages
        pages.append(page)
        assert len(pages) <= 21, "the pages do not end"
        params["before"] = page[-1]


ROUTES = [("/v1/preemptions", preemptions), ("/v1/starvation", starvations)]


@pytest.mark.parametrize(("path", "table"), ROUTES)
async def test_pages_reach_every_record_once_newest_first(
    api: httpx.AsyncClient, engine: AsyncEngine, path: str, table: Table
) -> None:
    tenant = f"history-{uuid.uuid4()}"
    body = {"name": "history", "tenant": tenant}
    token = (await api.post("/v1/tokens", json=body, headers=ADMIN)).json()["token"]
    await _write(engine, table, tenant, 7)
    pages = await _pages(api, path, token, limit=4)
    listed = [i for page in pages for i in page]
    assert len(listed) == len(set(listed)) == 21
    assert listed == sorted(listed, reverse=True)  # one transaction's records by id too


@pytest.mark.parametrize(("path", "table"), ROUTES)
async def test_before_another_tenants_record_is_a_422_naming_before(
    api: httpx.AsyncClient,
    engine: AsyncEngine,
    tenant_tokens: dict[str, str],
    path: str,
    table: Table,
) -> None:
    await _write(engine, table, "team-b", 1)
    theirs = (await api.get(path, params={"limit": 1}, headers=ADMIN)).json()[0]["id"]
    response = await api.get(path, params={"before": theirs}, headers=auth(tenant_tokens["team-a"]))
    assert response.status_code == 422
    assert [e["field"] for e in response.json()["errors"]] == ["before"]
