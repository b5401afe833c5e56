"""A claim's REST view says whether the control plane holds it suspended, from its open
preemption records (written here as the preemptor writes them): before, only
`GET /v1/preemptions` did, and the claim read `ready` as if it ran."""

from __future__ import annotations

from typing import Any

import httpx
from sqlalchemy import event, insert, update
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.contracts.claims import ClaimView
from qshare.contracts.schema import claims, preemptions
from tests.controlplane.conftest import ADMIN_TOKEN, Claim, Register, auth

ADMIN = auth(ADMIN_TOKEN)


async def _record(engine: AsyncEngine, claim: ClaimView, kind: str, **columns: Any) -> int:
    row = {"claim_id": claim.id, "tenant": claim.tenant, "kind": kind, "reason": kind} | columns
    async with engine.begin() as conn:
        inserted = await conn.execute(insert(preemptions).returning(preemptions.c.id), [row])
        return int(inserted.scalar_one())


async def _view(api: httpx.AsyncClient, claim: ClaimView) -> dict[str, Any]:
    response = await api.get(f"/v1/claims/{claim.id}", headers=ADMIN)
    assert response.status_code == 200, response.text
    return dict(response.json())


async def test_an_operator_suspension_shows_on_the_claim_and_in_the_listing(
    api: httpx.AsyncClient, register: Register, claim: Claim, engine: AsyncEngine
) -> None:
    await register("n1", cards=2)
    held, running = await claim(), await claim()
    record = await _record(engine, held, "operator")
    suspended = (await _view(api, held))["suspended"]
    assert suspended["kind"] == "operator" and suspended["reason"] == "operator"
    assert (suspended["preemption"], suspended["cards"]) == (record, None)
    assert suspended["since"]
    listed = (await api.get("/v1/claims", headers=ADMIN)).json()["items"]
    by_id = {c["id"]: c["suspended"] for c in listed}
    assert by_id[str(held.id)] == suspended and by_id[str(running.id)] is None


async def test_a_gang_suspension_names_its_busy_cards(
    api: httpx.AsyncClient, register: Register, claim: Claim, engine: AsyncEngine
) -> None:
    await register("n1")
    held = await claim(priority="low")
    await _record(engine, held, "gang", gpu_uuid="n1-g0", busy_gpus=["n1-g0", "n2-g1"],
                  reason="high priority busy on n1-g0")  # fmt: skip
    suspended = (await _view(api, held))["suspended"]
    assert (suspended["kind"], suspended["cards"]) == ("gang", ["n1-g0", "n2-g1"])


async def test_an_operator_hold_is_shown_before_a_gang_hold_and_an_eviction_is_none(
    api: httpx.AsyncClient, register: Register, claim: Claim, engine: AsyncEngine
) -> None:
    """An operator's hold outlasts the gang's (only a resume ends it); an eviction stops
    nothing during its grace."""
    await register("n1", cards=2)
    both, evicted = await claim(priority="low"), await claim(priority="low")
    await _record(engine, both, "gang", gpu_uuid="n1-g1", busy_gpus=["n1-g1"])
    operator = await _record(engine, both, "operator")
    await _record(engine, evicted, "eviction")
    assert (await _view(api, both))["suspended"]["preemption"] == operator
    assert (await _view(api, evicted))["suspended"] is None


async def test_a_resumed_or_released_claim_is_not_shown_suspended(
    api: httpx.AsyncClient, register: Register, claim: Claim, engine: AsyncEngine
) -> None:
    await register("n1", cards=2)
    resumed, released = await claim(), await claim()
    first = await _record(engine, resumed, "operator")
    await _record(engine, released, "operator")
    async with engine.begin() as conn:
        ended = preemptions.c.id == first
        await conn.execute(
            update(preemptions).where(ended).values(ended_at=preemptions.c.started_at)
        )
        gone = claims.c.id == released.id
        await conn.execute(update(claims).where(gone).values(status="released"))
    assert (await _view(api, resumed))["suspended"] is None
    page = (await api.get("/v1/claims?status=released", headers=ADMIN)).json()["items"]
    assert [c["suspended"] for c in page if c["id"] == str(released.id)] == [None]


async def test_a_page_of_claims_reads_its_suspensions_in_one_statement(
    api: httpx.AsyncClient, register: Register, claim: Claim, engine: AsyncEngine
) -> None:
    """Guard: the claims, their vGPUs and their suspensions: three statements for a page,
    however many claims it holds (not one per claim)."""
    await register("n1", cards=4)
    for made in [await claim() for _ in range(4)]:
        await _record(engine, made, "operator")
    from qshare_api.claims import repository

    seen: list[str] = []
    statements = _Counting(seen)
    async with engine.connect() as conn:
        event.listen(conn.sync_connection, "before_cursor_execute", statements)
        views, _ = await repository.list_claims(conn, repository.ClaimFilter(), 50, None)
    assert sum(v.suspended is not None for v in views) == 4
    assert len(seen) == 3, seen


class _Counting:
    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    def __call__(self, *args: Any) -> None:
        self.seen.append(str(args[2]).split()[0])
