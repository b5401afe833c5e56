# ruff: noqa: F811 (the fixture api_url, imported, is a parameter of the tests)
"""Pages of the lists that answer a plain array (tokens, quotas, nodes, cards): `limit` and
`cursor`, the next page named by the Link header; pages joined are the whole list in its
order, whatever is removed between them; a cursor this API did not write is a 422 naming
`cursor`; the CLI's listings still show everything."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.cli import main
from qshare.contracts.schema import tokens
from qshare_api import client as api_client
from tests.controlplane.conftest import ADMIN_TOKEN, Register, auth
from tests.controlplane.test_cli import api_url  # noqa: F401 (the server the CLI calls)

ADMIN = auth(ADMIN_TOKEN)
LISTS = {"/v1/tokens": "id", "/v1/quotas": "tenant", "/v1/nodes": "name", "/v1/gpus": "uuid"}
"""Each paged list, and what names one of its items."""


async def _fill(api: httpx.AsyncClient, register: Register) -> None:
    """Three nodes of two cards, three quotas, two more tokens."""
    for name in ("pg-a", "pg-b", "pg-c"):
        await register(name, cards=2)
    for tenant in ("pg-x", "pg-y", "pg-z"):
        await api.put(f"/v1/quotas/{tenant}", json={"cards": 1}, headers=ADMIN)
    for n in range(2):
        body = {"name": f"pages {n}", "tenant": "pg-x", "role": "tenant"}
        await api.post("/v1/tokens", json=body, headers=ADMIN)


async def _pages(api: httpx.AsyncClient, path: str, limit: int, **params: str) -> list[list[Any]]:
    """Every page of `path`, following the Link header."""
    pages: list[list[Any]] = []
    url: str | None = str(httpx.URL(path, params=params | {"limit": limit}))
    while url:
        response = await api.get(url, headers=ADMIN)
        assert response.status_code == 200, response.text
        pages.append(response.json())
        url = response.links.get("next", {}).get("url")
    return pages


async def test_pages_joined_are_the_whole_list_in_order(
    api: httpx.AsyncClient, register: Register
) -> None:
    await _fill(api, register)
    for path, key in LISTS.items():
        whole = await api.get(path, headers=ADMIN)
        assert "link" not in whole.headers
        pages = await _pages(api, path, limit=2)
        assert all(len(p) == 2 for p in pages[:-1]) and 1 <= len(pages[-1]) <= 2, path
        joined = [item[key] for p in pages for item in p]
        assert joined == [item[key] for item in whole.json()], path
        assert len(pages) >= 2, path


async def test_a_filter_stays_in_the_next_page(api: httpx.AsyncClient, register: Register) -> None:
    await _fill(api, register)
    pages = await _pages(api, "/v1/gpus", limit=1, node="pg-b")
    assert [[g["uuid"] for g in p] for p in pages] == [["pg-b-g0"], ["pg-b-g1"]]


async def test_an_item_removed_between_pages_loses_none_after_it(
    api: httpx.AsyncClient, register: Register
) -> None:
    await _fill(api, register)
    first = await api.get("/v1/quotas?limit=2", headers=ADMIN)
    assert [q["tenant"] for q in first.json()] == ["pg-x", "pg-y"]
    assert (await api.delete("/v1/quotas/pg-y", headers=ADMIN)).status_code == 204
    rest = await api.get(first.links["next"]["url"], headers=ADMIN)
    assert rest.status_code == 200, rest.text
    assert [q["tenant"] for q in rest.json()] == ["pg-z"]


async def test_tokens_made_at_one_instant_keep_one_order(
    api: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    at = datetime(2001, 1, 1, tzinfo=UTC)
    rows = [{"id": uuid.uuid4(), "name": "same time", "tenant": "pg-t", "role": "tenant",
             "token_hash": uuid.uuid4().hex, "created_at": at} for _ in range(5)]  # fmt: skip
    async with engine.begin() as conn:
        await conn.execute(insert(tokens), rows)
    pages = await _pages(api, "/v1/tokens", limit=2)
    listed = [t["id"] for p in pages for t in p if t["name"] == "same time"]
    assert listed == sorted(str(r["id"]) for r in rows)


def _cursor(*key: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode()


BAD_CURSORS = {
    "/v1/tokens": ["nonsense", _cursor("pg-a"), _cursor("2001-01-01T00:00:00", str(uuid.uuid4())),
                   _cursor("0001-01-01T00:00:00+01:00", str(uuid.uuid4()))],
    "/v1/quotas": [_cursor(" "), _cursor("a\x00b"), _cursor(7), _cursor("a", "b"), "e30=",
                   _cursor("\ud800")],
    "/v1/nodes": [_cursor("bad name!"), _cursor("x" * 300), _cursor(["a"])],
    "/v1/gpus": [_cursor("pg-a", 2**31), _cursor("pg-a", -1), _cursor("pg-a"),
                 _cursor("\ud800", 0)],
}  # fmt: skip
"""Cursors this API never writes: not base64 JSON, another list's, out of range, not storable."""


async def test_a_cursor_this_api_did_not_write_is_a_422_naming_cursor(
    api: httpx.AsyncClient,
) -> None:
    for path, cursors in BAD_CURSORS.items():
        for cursor in cursors:
            response = await api.get(path, params={"cursor": cursor, "limit": 2}, headers=ADMIN)
            assert response.status_code == 422, (path, cursor, response.text)
            assert [e["field"] for e in response.json()["errors"]] == ["cursor"], response.text
        for limit in ("0", "501", "x"):
            response = await api.get(path, params={"limit": limit}, headers=ADMIN)
            assert response.status_code == 422, (path, limit, response.text)
            assert [e["field"] for e in response.json()["errors"]] == ["limit"], response.text


async def _qshare(url: str, *args: str) -> int:
    group, *rest = args
    return await asyncio.to_thread(main, [group, "--url", url, "--token", ADMIN_TOKEN, *rest])


async def test_the_cli_listings_follow_every_page(
    api: httpx.AsyncClient,
    api_url: str,
    register: Register,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await _fill(api, register)
    monkeypatch.setattr(api_client, "PAGE", 2)  # pages of 2, so each listing takes several
    for group, path in (("tokens", "/v1/tokens"), ("quotas", "/v1/quotas"),
                        ("nodes", "/v1/nodes"), ("gpus", "/v1/gpus")):  # fmt: skip
        assert await _qshare(api_url, group, "list", "-o", "json") == 0
        listed = json.loads(capsys.readouterr().out)
        assert listed == (await api.get(path, headers=ADMIN)).json(), group
