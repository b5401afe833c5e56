"""A claim's `suspended` over the whole loop: set by an operator's suspend and by its gang's
busy card, cleared by the resume, by the card going idle and by deleting the claim, and
still there after the preemptor restarts (it is read from the preemption records)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from nats.aio.client import Client as Nats
from nats.aio.msg import Msg

from qshare.contracts import subjects

from .conftest import Restarts, StartAgent, claim_until, eventually, ready_claim
from .test_card_resync import gang_beside_high_priority


async def _suspended(api: httpx.AsyncClient, claim_id: str) -> Any:
    return (await api.get(f"/v1/claims/{claim_id}")).json()["suspended"]


async def test_an_operator_suspension_outlives_a_preemptor_restart_until_resumed(
    api: httpx.AsyncClient, start_agent: StartAgent, restartable: Restarts
) -> None:
    await start_agent()
    claim = await ready_claim(api)
    assert (await api.post(f"/v1/claims/{claim['id']}/suspend")).status_code == 200
    await restartable.stop()
    await restartable.start()
    assert (await _suspended(api, claim["id"]))["kind"] == "operator"
    assert (await api.post(f"/v1/claims/{claim['id']}/resume")).status_code == 200
    assert await _suspended(api, claim["id"]) is None


async def test_operator_suspend_and_resume_publish_the_claims_events(
    api: httpx.AsyncClient, nc: Nats, start_agent: StartAgent
) -> None:
    """Guard: the events a watcher of the claim gets (and `GET /v1/events` streams)."""
    await start_agent()
    claim = await ready_claim(api)
    seen: list[str] = []
    sub = await nc.subscribe(subjects.claim_event(claim["id"], "*"), cb=_noting(seen))
    await nc.flush()
    assert (await api.post(f"/v1/claims/{claim['id']}/suspend")).status_code == 200
    await eventually(lambda: _holds(lambda: seen[-1:] == ["suspended"]))
    assert (await api.post(f"/v1/claims/{claim['id']}/resume")).status_code == 200
    await eventually(lambda: _holds(lambda: seen[-1:] == ["resumed"]))
    await sub.unsubscribe()
    assert seen == ["suspended", "resumed"]


def _noting(seen: list[str]) -> Callable[[Msg], Awaitable[None]]:
    async def note(msg: Msg) -> None:
        kind = msg.subject.rsplit(".", 1)[-1]
        if kind in ("suspended", "resumed"):  # not a late `ready` from the outbox
            seen.append(kind)

    return note


async def _holds(check: Callable[[], bool]) -> bool:
    await asyncio.sleep(0)
    return check()


async def test_a_deleted_suspended_claim_is_not_shown_suspended(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    await start_agent()
    claim = await ready_claim(api)
    assert (await api.post(f"/v1/claims/{claim['id']}/suspend")).status_code == 200
    assert (await api.delete(f"/v1/claims/{claim['id']}")).status_code == 200
    await eventually(lambda: _released(api, claim["id"]))
    page = (await api.get("/v1/claims", params={"status": "released"})).json()["items"]
    assert [c["suspended"] for c in page if c["id"] == claim["id"]] == [None]


async def _released(api: httpx.AsyncClient, claim_id: str) -> bool:
    page = (await api.get("/v1/claims", params={"status": "released"})).json()["items"]
    return any(c["id"] == claim_id for c in page)


async def test_a_gang_held_by_a_busy_card_says_so_until_the_card_is_idle(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    agent = await start_agent(cards=2)
    client, _ = await gang_beside_high_priority(api, agent)
    gang = (await api.get("/v1/claims", params={"priority": "low"})).json()["items"][0]
    hp = (await api.get("/v1/claims", params={"priority": "high"})).json()["items"][0]
    with client:
        client.launch_begin()
        await eventually(lambda: _has_suspension(api, gang["id"]))
        held = await _suspended(api, gang["id"])
        assert (held["kind"], held["cards"]) == ("gang", [hp["vgpus"][0]["gpu"]])
        assert await _suspended(api, hp["id"]) is None
        client.launch_end()
        await eventually(lambda: _has_suspension(api, gang["id"], False))
    assert (await claim_until(api, gang["id"], "ready"))["suspended"] is None


async def _has_suspension(api: httpx.AsyncClient, claim_id: str, wanted: bool = True) -> bool:
    return (await _suspended(api, claim_id) is not None) == wanted
