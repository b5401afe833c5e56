"""A claim created while its class is deleted or retired, forced to interleave: the class
change is held open in a transaction of the test's own until the claim waits for its row
(or the other way round), so each order is seen every run. No order is a 500 or leaves a
claim naming a class that is gone or retired."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from qshare.contracts.claims import ClaimSpec, CreateClaim
from qshare.settings import ClusterSettings
from qshare_allocator.claims.service import ClaimService
from tests.controlplane.conftest import ADMIN_TOKEN, Claim, Register, auth, eventually
from tests.controlplane.test_class_changes import _new_class

ADMIN = auth(ADMIN_TOKEN)


def _post_claim(api: httpx.AsyncClient, name: str, vmemory: str = "1Gi") -> Awaitable[Any]:
    body = {"priority": "low", "vcore": 10, "vmemory": vmemory, "class_name": name}
    return api.post("/v1/claims", headers=ADMIN, json=body)


async def _waits_for_a_row_lock(engine: AsyncEngine, statement: str) -> None:
    """Until a session of the test database running a statement `LIKE` the pattern
    `statement` waits for a lock another one holds."""

    async def waiting() -> bool:
        query = text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                     "AND datname = current_database() AND query LIKE :q")  # fmt: skip
        async with engine.connect() as conn:
            return bool((await conn.execute(query, {"q": statement})).scalar_one())

    await eventually(waiting)


WRITE = "WITH write_0 AS %INSERT INTO claims%"
"""The statement that writes a new claim (the server shows its first 1 kB only)."""
LOCK = "%FROM classes%FOR UPDATE%"
"""The class's row locked by a delete (or change) over REST."""


async def _while_held(
    engine: AsyncEngine, statements: list[str], name: str, racer: Awaitable[Any], waits_in: str
) -> Any:
    """Run `statements` (on class `name`) in an open transaction, start `racer`, commit once
    the racer's statement `waits_in` waits for the row, and return what the racer answers."""
    async with engine.connect() as conn:
        held = await conn.begin()
        for statement in statements:
            await conn.execute(text(statement), {"n": name})
        task = asyncio.ensure_future(racer)
        await _waits_for_a_row_lock(engine, waits_in)
        await held.commit()
    return await task


async def _claims_of(conn: AsyncConnection, name: str) -> int:
    query = text("SELECT count(*) FROM claims WHERE class_name = :n")
    return int((await conn.execute(query, {"n": name})).scalar_one())


def _fields(response: httpx.Response) -> list[str]:
    return [e["field"] for e in response.json().get("errors", [])]


async def test_a_claim_written_as_its_class_is_deleted_is_422_naming_class_name(
    api: httpx.AsyncClient, engine: AsyncEngine, register: Register
) -> None:
    """The claim read the class before the delete committed, and its write met the broken
    foreign key (claims_class_name_fkey): refused, nothing written."""
    name = await _new_class(api)
    await register("race-1", cards=1)
    delete = ["DELETE FROM classes WHERE name = :n"]
    response = await _while_held(engine, delete, name, _post_claim(api, name), WRITE)
    assert response.status_code == 422, response.text
    assert _fields(response) == ["class_name"] and f"class '{name}' was deleted" in response.text
    async with engine.connect() as conn:
        assert await _claims_of(conn, name) == 0


async def test_a_claim_written_as_its_class_is_retired_is_422_naming_class_name(
    api: httpx.AsyncClient, engine: AsyncEngine, register: Register
) -> None:
    """The foreign key holds (the retired row stays), so the claim's write reads the class
    under the lock the key takes, and sees the retirement it waited for (a retirement locks
    the row FOR UPDATE first: an update of other columns alone does not wait for that
    lock)."""
    name = await _new_class(api)
    await register("race-2", cards=1)
    retire = ["SELECT name FROM classes WHERE name = :n FOR UPDATE",  # as DELETE over REST
              "UPDATE classes SET retired_at = now() WHERE name = :n"]  # fmt: skip
    response = await _while_held(engine, retire, name, _post_claim(api, name), WRITE)
    assert response.status_code == 422, response.text
    assert _fields(response) == ["class_name"] and f"class '{name}' is retired" in response.text
    async with engine.connect() as conn:
        assert await _claims_of(conn, name) == 0


async def test_a_delete_as_a_claim_is_written_is_409_counting_it(
    api: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    """The claim's insert (here the test's own, not yet committed) holds the class's key;
    the delete waits for it and then counts it."""
    name = await _new_class(api)
    insert = ("INSERT INTO claims (id, tenant, status, priority, vcore, vmemory_mib, count, "
              f"class_name) VALUES ('{uuid.uuid4()}', 'team-a', 'pending', 'low', 10, 1024, "
              "1, :n)")  # fmt: skip
    delete = api.delete(f"/v1/classes/{name}", headers=ADMIN)
    response = await _while_held(engine, [insert], name, delete, LOCK)
    assert response.status_code == 409, response.text
    assert "named by 1 claims" in response.json()["detail"]
    assert "(1 pending)" in response.json()["detail"]


async def test_a_class_added_again_with_another_provisioner_reaches_replicas_that_kept_it(
    api: httpx.AsyncClient, engine: AsyncEngine, register: Register, claim: Claim
) -> None:
    """Each allocator replica kept the class's provisioner (claims refused for their size
    after the class was read); deleted and added again as `whole`, a new claim is never
    placed as `qshare` made it: one kept the old provisioner is a 409 asking to send it
    again, and the next is placed on a whole card."""
    name = await _new_class(api)
    await register("race-3", cards=1, memory="16Gi")
    for _ in range(8):
        refused = await _post_claim(api, name, vmemory="64Gi")
        assert refused.status_code == 422 and _fields(refused) == ["vmemory"], refused.text
    assert (await api.delete(f"/v1/classes/{name}", headers=ADMIN)).status_code == 204
    body = {"name": name, "provisioner": "whole"}
    assert (await api.post("/v1/classes", json=body, headers=ADMIN)).status_code == 201
    answers = [await _post_claim(api, name) for _ in range(3)]
    codes = [a.status_code for a in answers]
    assert set(codes) <= {201, 409} and 201 in codes, [a.text for a in answers]
    assert all("send it again" in a.text for a in answers if a.status_code == 409)
    async with engine.connect() as conn:
        query = text("SELECT allocated_mib FROM gpus WHERE node_name = 'race-3'")
        assert (await conn.execute(query)).scalar_one() == 16384


async def test_a_claim_does_not_wait_for_another_claim_of_its_class_in_flight(
    api: httpx.AsyncClient, engine: AsyncEngine, register: Register, claim: Claim
) -> None:
    """A claim created (not yet committed) in a transaction of the test's own, as another
    replica's group would hold it; a claim of the same class is answered meanwhile: a claim
    holds its class only with the key-share lock its foreign key takes, which claims share
    (before: the class was read FOR NO KEY UPDATE, one transaction of a class at a time)."""
    name = await _new_class(api)
    await register("race-4a", pool="race-4a")  # a node each: a placement locks its node
    await register("race-4b", pool="race-4b")
    spec = {"priority": "low", "vcore": 10, "vmemory": "1Gi", "class_name": name}
    first = CreateClaim(tenant="team-a", spec=ClaimSpec.model_validate(
        spec | {"node_selector": {"pool": "race-4a"}}))  # fmt: skip
    async with engine.connect() as conn:
        held = await conn.begin()
        assert (await ClaimService(ClusterSettings(), "test").create(conn, first)).created
        other = await asyncio.wait_for(
            claim("team-b", **spec | {"node_selector": {"pool": "race-4b"}}), 10
        )
        await held.rollback()
    assert other.status.value == "placed" and other.node == "race-4b"
