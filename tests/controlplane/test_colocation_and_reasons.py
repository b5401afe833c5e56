"""Placement co-locates high with low priority (each priority spreads against its own kind),
a pending claim's reason says what is missing, and an impossible claim is refused at once."""

from __future__ import annotations

import pytest

from qshare.contracts.errors import InvalidInput

from .conftest import Claim, Register


async def test_a_high_priority_claim_lands_beside_low_priority_work(
    register: Register, claim: Claim
) -> None:
    await register("n1", cards=2)
    await register("n2", cards=2)
    low = await claim(priority="low", vcore=50, vmemory="2Gi")
    high = await claim(priority="high", vcore=50, vmemory="2Gi")
    assert high.vgpus[0].gpu == low.vgpus[0].gpu


async def test_high_priority_claims_spread_away_from_each_other(
    register: Register, claim: Claim
) -> None:
    await register("n1", cards=2)
    first = await claim(priority="high", vcore=30, vmemory="2Gi")
    second = await claim(priority="high", vcore=30, vmemory="2Gi")
    assert first.vgpus[0].gpu != second.vgpus[0].gpu


async def test_a_low_priority_claim_lands_beside_high_priority_work(
    register: Register, claim: Claim
) -> None:
    await register("n1", cards=2)
    await register("n2", cards=2)
    high = await claim(priority="high", vcore=50, vmemory="2Gi")
    low = await claim(priority="low", vcore=50, vmemory="2Gi")
    assert low.vgpus[0].gpu == high.vgpus[0].gpu


async def test_the_pending_reason_of_an_empty_cluster_says_no_node_is_registered(
    claim: Claim,
) -> None:
    pending = await claim()
    assert pending.reason == "no node is registered yet"


async def test_the_pending_reason_names_a_missing_ready_node_not_capacity(
    register: Register, claim: Claim
) -> None:
    await register("n1", zone="a")
    pending = await claim(node_selector={"zone": "b"})
    assert pending.reason is not None
    assert pending.reason.startswith("no Ready, schedulable node matching")


async def test_a_claim_larger_than_any_card_is_refused_at_once(
    register: Register, claim: Claim
) -> None:
    await register("n1", memory="16Gi")
    with pytest.raises(InvalidInput, match="more than any card"):
        await claim(vmemory="32Gi")


async def test_a_claim_larger_than_any_card_is_told_both_sizes_in_readable_units(
    register: Register, claim: Claim
) -> None:
    await register("n1", memory="16Gi")
    with pytest.raises(InvalidInput) as refused:
        await claim(vmemory="40Gi")
    assert str(refused.value) == (
        "vmemory: 40 GiB is more than any card in the cluster has (the largest has 16 GiB)"
    )


async def test_a_claim_for_more_cards_than_any_node_has_is_refused_at_once(
    register: Register, claim: Claim
) -> None:
    await register("n1", cards=2)
    with pytest.raises(InvalidInput, match="no node has 3 cards"):
        await claim(count=3)
