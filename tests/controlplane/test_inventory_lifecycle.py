"""Cards that leave, come back, are replaced or removed (issue 11, items 3, 5 and 7)."""

from __future__ import annotations

import httpx
from nats.aio.client import Client
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.contracts import envelope, rpc, subjects
from qshare.contracts.nodes import Heartbeat, NodeRegistration, NodeView
from tests.controlplane.conftest import ADMIN_TOKEN, Claim, auth, card, claim_status

ADMIN = auth(ADMIN_TOKEN)


async def _register(nc: Client, name: str, *cards: tuple[str, int, str]) -> NodeView:
    gpus = [card(uuid_, index, memory) for uuid_, index, memory in cards]
    registration = NodeRegistration.model_validate({"name": name, "gpus": gpus})
    return await rpc.call(nc, subjects.NODES_REGISTER, "test", registration, NodeView)


async def _beat(nc: Client, node: str, unhealthy: list[str] | None = None) -> None:
    beat = envelope.wrap(node, "io.qshare.node.heartbeat", Heartbeat(unhealthy=unhealthy or []))
    await nc.request(subjects.heartbeat(node), envelope.encode(beat), timeout=5)


async def _card(engine: AsyncEngine, uuid_: str) -> dict[str, object] | None:
    async with engine.connect() as conn:
        query = text("SELECT healthy, retired, allocated_mib, memory_mib FROM gpus WHERE uuid=:u")
        row = (await conn.execute(query, {"u": uuid_})).one_or_none()
    return None if row is None else dict(row._mapping)


async def test_a_card_the_node_stopped_reporting_stays_out_after_a_heartbeat(
    nc: Client, claim: Claim, engine: AsyncEngine
) -> None:
    await _register(nc, "n1", ("g0", 0, "16Gi"), ("g1", 1, "16Gi"))
    await _register(nc, "n1", ("g0", 0, "16Gi"))
    await _beat(nc, "n1")
    assert await _card(engine, "g1") == {
        "healthy": True, "retired": True, "allocated_mib": 0, "memory_mib": 16384,
    }  # fmt: skip
    assert (await claim(count=2)).status == "pending"


async def test_a_retired_card_returns_when_the_node_reports_it_again(
    nc: Client, claim: Claim
) -> None:
    await _register(nc, "n1", ("g0", 0, "16Gi"), ("g1", 1, "16Gi"))
    await _register(nc, "n1", ("g0", 0, "16Gi"))
    await _register(nc, "n1", ("g0", 0, "16Gi"), ("g1", 1, "16Gi"))
    assert (await claim(count=2)).status == "placed"


async def test_an_unhealthy_card_heals_with_a_heartbeat_that_no_longer_lists_it(
    nc: Client, claim: Claim
) -> None:
    await _register(nc, "n1", ("g0", 0, "16Gi"), ("g1", 1, "16Gi"))
    await _beat(nc, "n1", ["g1"])
    assert (await claim(count=2)).status == "pending"
    await _beat(nc, "n1")
    assert (await claim(count=2)).status == "placed"


async def test_a_new_card_takes_the_index_of_the_card_it_replaced(
    nc: Client, claim: Claim, engine: AsyncEngine
) -> None:
    await _register(nc, "n1", ("old", 0, "16Gi"))
    view = await _register(nc, "n1", ("new", 0, "16Gi"))
    assert view.gpus == 1
    assert await _card(engine, "old") is None
    assert [v.gpu for v in (await claim()).vgpus] == ["new"]


async def test_replacing_a_card_fails_the_claims_it_held_with_a_reason(
    nc: Client, claim: Claim, engine: AsyncEngine
) -> None:
    await _register(nc, "n1", ("old", 0, "16Gi"))
    held = await claim()
    await _register(nc, "n1", ("new", 0, "16Gi"))
    assert await claim_status(engine, held.id) == "failed"


async def test_removing_a_card_fails_its_claims_and_frees_the_rest_of_the_node(
    api: httpx.AsyncClient, nc: Client, claim: Claim, engine: AsyncEngine
) -> None:
    await _register(nc, "n1", ("g0", 0, "16Gi"), ("g1", 1, "16Gi"))
    both = await claim(count=2, vmemory="4Gi")
    response = await api.delete("/v1/nodes/n1/gpus/g1", headers=ADMIN)
    assert response.status_code == 200, response.text
    assert response.json()["failed_claims"] == [str(both.id)]
    failed = (await api.get(f"/v1/claims/{both.id}", headers=ADMIN)).json()
    assert (failed["status"], failed["vgpus"]) == ("failed", [])
    assert "removed" in failed["reason"]
    assert (await _card(engine, "g0"))["allocated_mib"] == 0  # type: ignore[index]
    assert (await api.get("/v1/nodes/n1", headers=ADMIN)).json()["gpus"] == 1


async def test_removing_a_node_fails_its_claims_and_forgets_it(
    api: httpx.AsyncClient, nc: Client, claim: Claim, engine: AsyncEngine
) -> None:
    await _register(nc, "n1", ("g0", 0, "16Gi"))
    held = await claim()
    response = await api.delete("/v1/nodes/n1", headers=ADMIN)
    assert response.json()["failed_claims"] == [str(held.id)]
    assert await claim_status(engine, held.id) == "failed"
    assert (await api.get("/v1/nodes/n1", headers=ADMIN)).status_code == 404
    assert (await api.get("/v1/gpus", headers=ADMIN)).json() == []


async def test_removing_an_unknown_card_or_node_is_404(api: httpx.AsyncClient) -> None:
    assert (await api.delete("/v1/nodes/nope", headers=ADMIN)).status_code == 404
    await _register_over_rest(api)
    assert (await api.delete("/v1/nodes/n9/gpus/nope", headers=ADMIN)).status_code == 404


async def test_a_tenant_cannot_remove_a_node(
    api: httpx.AsyncClient, tenant_tokens: dict[str, str]
) -> None:
    await _register_over_rest(api)
    response = await api.delete("/v1/nodes/n9", headers=auth(tenant_tokens["team-a"]))
    assert response.status_code == 403


async def _register_over_rest(api: httpx.AsyncClient) -> None:
    body = {"name": "n9", "gpus": [card("n9-g0", 0)]}
    assert (await api.post("/v1/nodes", json=body, headers=ADMIN)).status_code == 200


async def test_a_whole_card_stays_exclusive_when_it_reregisters_with_more_memory(
    nc: Client, claim: Claim, engine: AsyncEngine
) -> None:
    await _register(nc, "n1", ("g0", 0, "16Gi"))
    whole = await claim(class_name="whole")
    await _register(nc, "n1", ("g0", 0, "32Gi"))
    waiting = await claim(vmemory="4Gi")
    assert waiting.status == "pending"
    assert (await _card(engine, "g0"))["allocated_mib"] == 32768  # type: ignore[index]
    from qshare.contracts.claims import ClaimView, DeleteClaim

    # the waiting claim goes first, or the pending sweep could place it on the freed card
    await rpc.call(nc, subjects.CLAIMS_DELETE, "t", DeleteClaim(claim_id=waiting.id), ClaimView)
    await rpc.call(nc, subjects.CLAIMS_DELETE, "t", DeleteClaim(claim_id=whole.id), ClaimView)
    assert (await _card(engine, "g0"))["allocated_mib"] == 0  # type: ignore[index]
