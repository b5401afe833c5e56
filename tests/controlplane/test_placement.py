"""Placement rules: where claims go, what stays Pending, and what frees capacity."""

from __future__ import annotations

import pytest
from nats.aio.client import Client
from prometheus_client import REGISTRY
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare.contracts import envelope, rpc, subjects
from qshare.contracts.claims import ClaimView, DeleteClaim
from qshare.contracts.errors import InvalidInput, NotFound
from qshare.contracts.nodes import Heartbeat
from tests.controlplane.conftest import Claim, Register, claim_status, eventually


async def test_a_claim_is_placed_on_a_ready_node_with_room(
    register: Register, claim: Claim
) -> None:
    await register("n1", cards=1)
    placed = await claim(vcore=30, vmemory="4Gi")
    assert placed.status == "placed"
    assert [(v.node, v.gpu, v.vcore, v.vmemory_mib) for v in placed.vgpus] == [
        ("n1", "n1-g0", 30, 4096)
    ]


async def test_card_memory_is_never_oversubscribed_across_priorities(
    register: Register, claim: Claim
) -> None:
    await register("n1", cards=1, memory="8Gi")
    await claim(priority="high", vmemory="4Gi")
    await claim(priority="low", vmemory="4Gi")
    third = await claim(priority="low", vmemory="1Gi")
    assert third.status == "pending"
    assert third.reason and "no capacity" in third.reason


async def test_core_shares_sum_to_at_most_100_within_each_priority(
    register: Register, claim: Claim
) -> None:
    await register("n1", cards=1, memory="80Gi")
    await claim(priority="high", vcore=60)
    assert (await claim(priority="high", vcore=50)).status == "pending"
    assert (await claim(priority="low", vcore=50)).status == "placed"
    assert (await claim(priority="high", vcore=40)).status == "placed"


async def test_a_card_holds_at_most_a_quarter_of_its_gib_in_vgpus(
    register: Register, claim: Claim
) -> None:
    await register("n1", cards=1, memory="8Gi")
    await claim(vcore=1)
    await claim(vcore=1)
    assert (await claim(vcore=1)).status == "pending"


async def test_a_vgpu_smaller_than_1_gib_is_invalid(register: Register, claim: Claim) -> None:
    await register("n1")
    with pytest.raises(InvalidInput) as caught:
        await claim(vmemory="512Mi")
    assert [e.field for e in caught.value.errors] == ["vmemory"]


async def test_count_takes_distinct_cards_of_one_node(register: Register, claim: Claim) -> None:
    await register("n1", cards=1)
    await register("n2", cards=2)
    placed = await claim(count=2)
    assert {v.node for v in placed.vgpus} == {"n2"}
    assert {v.gpu for v in placed.vgpus} == {"n2-g0", "n2-g1"}


async def test_node_selector_limits_the_nodes(register: Register, claim: Claim) -> None:
    await register("n1", zone="a")
    await register("n2", zone="b")
    assert (await claim(node_selector={"zone": "b"})).node == "n2"
    assert (await claim(node_selector={"zone": "c"})).status == "pending"


async def test_spread_prefers_the_node_with_most_free_memory(
    register: Register, claim: Claim
) -> None:
    await register("n1", cards=2)
    await register("n2", cards=2)
    first = await claim(vmemory="4Gi")
    second = await claim(vmemory="4Gi")
    assert {first.node, second.node} == {"n1", "n2"}


async def test_binpack_prefers_the_fullest_node_that_fits(register: Register, claim: Claim) -> None:
    await register("n1", cards=2)
    await register("n2", cards=2)
    first = await claim(vmemory="4Gi", placement={"node": "binpack", "card": "binpack"})
    second = await claim(vmemory="4Gi", placement={"node": "binpack", "card": "binpack"})
    assert second.node == first.node
    assert second.vgpus[0].gpu == first.vgpus[0].gpu


async def test_card_spread_uses_the_emptiest_card_of_the_node(
    register: Register, claim: Claim
) -> None:
    await register("n1", cards=2)
    first = await claim(vmemory="4Gi")
    second = await claim(vmemory="4Gi")
    assert first.vgpus[0].gpu != second.vgpus[0].gpu


async def test_whole_class_takes_an_empty_card_entirely(register: Register, claim: Claim) -> None:
    await register("n1", cards=2)
    await claim(vmemory="4Gi")
    whole = await claim(class_name="whole")
    assert [(v.vmemory_mib, v.vcore) for v in whole.vgpus] == [(16384, 100)]
    assert (await claim(vmemory="1Gi", count=2)).status == "pending"


async def test_an_unknown_class_is_invalid(register: Register, claim: Claim) -> None:
    with pytest.raises(InvalidInput) as caught:
        await claim(class_name="no-such-class")
    assert [e.field for e in caught.value.errors] == ["class_name"]


async def test_an_unknown_class_error_names_the_known_ones(claim: Claim) -> None:
    with pytest.raises(InvalidInput) as caught:
        await claim(class_name="no-such-class")
    known = caught.value.errors[0].message.partition("(known: ")[2].rstrip(")").split(", ")
    assert {"qshare", "whole"} <= set(known)  # other tests of the session may add classes


async def test_a_node_without_heartbeats_gets_nothing(
    register: Register, claim: Claim, engine: AsyncEngine
) -> None:
    await register("n1")
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE nodes SET heartbeat_at = now() - interval '1 hour'"))
    assert (await claim()).status == "pending"


async def test_a_heartbeat_brings_the_node_back_and_places_pending_claims(
    register: Register, claim: Claim, engine: AsyncEngine, nc: Client
) -> None:
    await register("n1")
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE nodes SET heartbeat_at = now() - interval '1 hour'"))
    waiting = await claim()
    await nc.publish(
        subjects.heartbeat("n1"), envelope.encode(envelope.wrap("n1", "hb", Heartbeat()))
    )
    await eventually(lambda: _is(engine, waiting, "placed"))


async def test_an_unhealthy_card_gets_nothing(register: Register, claim: Claim, nc: Client) -> None:
    await register("n1", cards=2)
    beat = envelope.wrap("n1", "io.qshare.node.heartbeat", Heartbeat(unhealthy=["n1-g0"]))
    await nc.request(subjects.heartbeat("n1"), envelope.encode(beat), timeout=5)
    assert [v.gpu for v in (await claim()).vgpus] == ["n1-g1"]
    assert (await claim(count=2)).status == "pending"


async def test_a_pending_claim_is_placed_when_a_claim_is_deleted(
    register: Register, claim: Claim, nc: Client, engine: AsyncEngine
) -> None:
    await register("n1", cards=1, memory="4Gi")
    holder = await claim(vmemory="4Gi")
    waiting = await claim(vmemory="4Gi")
    assert waiting.status == "pending"
    await rpc.call(nc, subjects.CLAIMS_DELETE, "test", DeleteClaim(claim_id=holder.id), ClaimView)
    await eventually(lambda: _is(engine, waiting, "placed"))


async def test_a_pending_claim_is_placed_when_a_node_registers(
    register: Register, claim: Claim, engine: AsyncEngine
) -> None:
    waiting = await claim()
    assert waiting.status == "pending"
    await register("n1")
    await eventually(lambda: _is(engine, waiting, "placed"))


def _placed_later() -> float:
    return REGISTRY.get_sample_value("qshare_allocator_pending_placed_total") or 0.0


async def test_a_pending_claim_placed_later_is_counted_once(
    register: Register, claim: Claim, engine: AsyncEngine
) -> None:
    before = _placed_later()
    waiting = await claim()
    await register("n1")
    await eventually(lambda: _is(engine, waiting, "placed"))
    assert _placed_later() == before + 1


async def test_deleting_a_claim_releases_its_capacity(
    register: Register, claim: Claim, nc: Client, engine: AsyncEngine
) -> None:
    await register("n1", cards=1)
    held = await claim(vcore=70, vmemory="8Gi")
    await rpc.call(nc, subjects.CLAIMS_DELETE, "test", DeleteClaim(claim_id=held.id), ClaimView)
    async with engine.connect() as conn:
        row = (
            await conn.execute(text("SELECT allocated_mib, core_high, vgpu_count FROM gpus"))
        ).one()
        free = (await conn.execute(text("SELECT free_mib FROM nodes"))).scalar_one()
    assert tuple(row) == (0, 0, 0)
    assert free == 16384


async def test_another_tenant_cannot_delete_a_claim(
    register: Register, claim: Claim, nc: Client
) -> None:
    await register("n1")
    held = await claim(tenant="team-a")
    with pytest.raises(NotFound):
        command = DeleteClaim(claim_id=held.id, tenant="team-b")
        await rpc.call(nc, subjects.CLAIMS_DELETE, "test", command, ClaimView)


async def _is(engine: AsyncEngine, claim: ClaimView, status: str) -> bool:
    return await claim_status(engine, claim.id) == status
