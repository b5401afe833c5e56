"""A node that stops heartbeating, or a card that turns unhealthy: the claims on it get an
event and are placed again elsewhere (their class allows it by default)."""

from __future__ import annotations

from pathlib import Path

import httpx
from nats.aio.client import Client as Nats
from nats.aio.msg import Msg

from qshare import bus

from .conftest import StartAgent, eventually, ready_claim


async def test_a_claim_on_a_silent_node_is_placed_again_on_another(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    first = await start_agent()
    claim = await ready_claim(api)
    second = await start_agent()
    await first.stop()

    async def moved() -> bool:
        found = (await api.get(f"/v1/claims/{claim['id']}")).json()
        return bool(found["status"] == "ready" and found["node"] == second.name)

    await eventually(moved, 30)


async def test_a_claim_on_an_unhealthy_card_moves_to_a_healthy_one(
    api: httpx.AsyncClient, start_agent: StartAgent, tmp_path: Path, nc: Nats
) -> None:
    health = tmp_path / "unhealthy"
    await start_agent(cards=2, sim_unhealthy_file=health)
    claim = await ready_claim(api)
    sick = claim["vgpus"][0]["gpu"]
    seen: list[str] = []

    async def note(msg: Msg) -> None:
        seen.append(msg.subject)

    sub = await nc.subscribe(f"qshare.evt.claim.{claim['id']}.*", cb=note)
    await bus.settled(nc)
    health.write_text(sick)

    async def moved() -> bool:
        found = (await api.get(f"/v1/claims/{claim['id']}")).json()
        return bool(found["status"] == "ready" and found["vgpus"][0]["gpu"] != sick)

    await eventually(moved, 30)

    async def announced() -> bool:  # the relay may publish after the status is readable
        return f"qshare.evt.claim.{claim['id']}.pending" in seen

    await eventually(announced, 10)
    await sub.unsubscribe()
