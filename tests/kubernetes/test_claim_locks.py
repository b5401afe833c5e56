"""One call per claim at a time, to the end of its work: a caller that is cancelled (a kubelet
call past its deadline; grpc.aio may cancel the handler then) stops waiting, but its work goes
on holding the claim, so the next call for the claim waits for it rather than running beside
it."""

from __future__ import annotations

import asyncio

import pytest

from qshare_node_agent.kubernetes.claim_locks import ClaimLocks


async def test_a_cancelled_callers_work_keeps_its_claim_until_it_ends() -> None:
    locks, release, order = ClaimLocks(), asyncio.Event(), []

    async def first_work() -> None:
        await release.wait()
        order.append("first")

    async def second_work() -> None:
        order.append("second")

    first = asyncio.create_task(locks.run_holding(["claim-a"], first_work))
    await asyncio.sleep(0.01)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    second = asyncio.create_task(locks.run_holding(["claim-a"], second_work))
    await asyncio.sleep(0.05)
    assert order == []
    release.set()
    await asyncio.wait_for(second, 5)
    assert order == ["first", "second"]


async def test_calls_for_other_claims_do_not_wait() -> None:
    locks, release = ClaimLocks(), asyncio.Event()

    async def held() -> None:
        await release.wait()

    async def other() -> str:
        return "done"

    first = asyncio.create_task(locks.run_holding(["claim-a"], held))
    await asyncio.sleep(0.01)
    assert await asyncio.wait_for(locks.run_holding(["claim-b"], other), 5) == "done"
    release.set()
    await first
    assert locks.busy() == set()
