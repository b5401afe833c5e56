"""A low-priority gang on two cards whose high priority is busy on both stays suspended while
either card is busy, and resumes once both are idle: in the running preemptor, whose gang
record names every busy card holding the gang, and in one restarted meanwhile, which
rebuilds that from the record and the cards' announced states."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from nats.aio.client import Client as Nats
from nats.aio.msg import Msg
from sqlalchemy.ext.asyncio import AsyncEngine

from qshare import bus
from qshare.contracts import subjects
from qshare_driver import Client
from qshare_node_agent.app import NodeAgent
from qshare_preemptor.app import Preemptor
from qshare_preemptor.service import PreemptionService

from .conftest import Restarts, StartAgent, eventually, ready_claim
from .test_card_resync import handled_both_cards


@dataclass
class Gang:
    """A two-card LP gang beside a two-card HP claim on one node: the HP clients and the
    gang's vGPUs by card, and the gang's `resumed` events seen so far."""

    agent: NodeAgent
    claim_id: str
    hp: dict[str, Client]
    lp: dict[str, int]
    resumed: list[str] = field(default_factory=list)

    @property
    def cards(self) -> list[str]:
        return sorted(self.hp)

    def suspended(self) -> list[bool]:
        return [self.agent.node.vgpu_stats(self.lp[card]).suspended for card in self.cards]


@pytest.fixture
async def gang(api: httpx.AsyncClient, start_agent: StartAgent, nc: Nats) -> AsyncIterator[Gang]:
    agent = await start_agent(cards=2)
    lp = await ready_claim(api, count=2)
    hp = await ready_claim(api, priority="high", vcore=50, count=2)
    attach = agent.settings.segment_name, agent.settings.shm_dir
    with contextlib.ExitStack() as stack:
        clients = {
            v["gpu"]: stack.enter_context(Client.attach(attach[0], v["local_id"], attach[1]))
            for v in hp["vgpus"]
        }
        found = Gang(agent, lp["id"], clients, {v["gpu"]: v["local_id"] for v in lp["vgpus"]})

        async def note(msg: Msg) -> None:
            found.resumed.append(msg.subject)

        sub = await nc.subscribe(subjects.claim_event(lp["id"], "resumed"), cb=note)
        await bus.settled(nc)
        yield found
        await sub.unsubscribe()


async def handled(preemptor: Preemptor, act: Callable[[], Any]) -> None:
    """Do `act` (one card's busy or idle edge) and wait until the preemptor handled it."""
    assert preemptor.service is not None
    service, before = preemptor.service, preemptor.service.card_events
    act()
    await eventually(lambda: _holds(lambda: service.card_events > before))


async def both_busy(preemptor: Preemptor, gang: Gang) -> None:
    first, second = gang.cards
    await handled(preemptor, gang.hp[first].launch_begin)
    await eventually(lambda: _holds(lambda: gang.suspended()[1]))
    await handled(preemptor, gang.hp[second].launch_begin)


async def test_a_gang_held_by_two_busy_cards_stays_suspended_until_both_are_idle(
    preemptor: Preemptor, gang: Gang
) -> None:
    first, second = gang.cards
    await both_busy(preemptor, gang)
    await handled(preemptor, gang.hp[first].launch_end)
    assert gang.suspended() == [True, True]
    gang.hp[second].launch_end()
    await eventually(lambda: _holds(lambda: gang.suspended() == [False, False]))


async def test_the_gang_record_names_every_busy_card_holding_the_gang(
    api: httpx.AsyncClient, preemptor: Preemptor, gang: Gang
) -> None:
    first, second = gang.cards
    await both_busy(preemptor, gang)
    assert await busy_cards(api, gang) == [first, second]
    await handled(preemptor, gang.hp[first].launch_end)
    assert await busy_cards(api, gang) == [second]


async def test_a_restarted_preemptor_keeps_a_gang_suspended_while_either_of_its_cards_is_busy(
    preemptor: Preemptor, restartable: Restarts, gang: Gang
) -> None:
    first, second = gang.cards
    await both_busy(preemptor, gang)
    await restart(restartable)
    await handled(preemptor, gang.hp[first].launch_end)
    assert (gang.suspended(), gang.resumed) == ([True, True], [])
    gang.hp[second].launch_end()
    await eventually(lambda: _holds(lambda: gang.suspended() == [False, False]))


async def test_a_card_idle_while_the_preemptor_was_down_does_not_resume_a_gang_another_holds(
    preemptor: Preemptor, restartable: Restarts, gang: Gang, nc: Nats
) -> None:
    first, second = gang.cards
    await both_busy(preemptor, gang)
    idle: list[str] = []

    async def note(msg: Msg) -> None:
        idle.append(msg.subject)

    sub = await nc.subscribe(subjects.gpu_event(gang.agent.name, first, "idle"), cb=note)
    await bus.settled(nc)
    await restartable.stop()
    gang.hp[first].launch_end()  # no preemptor hears it
    await eventually(lambda: _holds(lambda: bool(idle)))
    await sub.unsubscribe()
    await restartable.start()
    await handled_both_cards(preemptor)
    assert (gang.suspended(), gang.resumed) == ([True, True], [])
    gang.hp[second].launch_end()
    await eventually(lambda: _holds(lambda: gang.suspended() == [False, False]))


async def test_a_preemptor_rebuilds_from_the_record_every_busy_card_holding_a_gang(
    preemptor: Preemptor, restartable: Restarts, gang: Gang, nc: Nats, engine: AsyncEngine
) -> None:
    """The state a new preemptor starts from, before any announcement: the idle event of one
    card leaves the gang suspended, that of the other resumes it."""
    first, second = gang.cards
    await both_busy(preemptor, gang)
    await restartable.stop()
    successor = PreemptionService(nc, engine, "qshare-preemptor/successor", timeout_s=5)
    await successor.reconcile()
    gang.hp[first].launch_end()
    await successor.card_event(gang.agent.name, first, busy=False)
    assert (gang.suspended(), gang.resumed) == ([True, True], [])
    gang.hp[second].launch_end()
    await successor.card_event(gang.agent.name, second, busy=False)
    assert gang.suspended() == [False, False]


async def restart(restartable: Restarts) -> None:
    """Stop and start the preemptor; return once it handled both cards' announced states."""
    await restartable.stop()
    await restartable.start()
    await handled_both_cards(restartable.preemptor)


async def busy_cards(api: httpx.AsyncClient, gang: Gang) -> list[str] | None:
    """The busy cards the gang's open `gang` record names."""
    records = (await api.get("/v1/preemptions", params={"claim": gang.claim_id})).json()
    (record,) = [r for r in records if r["kind"] == "gang" and r["ended_at"] is None]
    return sorted(record["busy_gpus"]) if record["busy_gpus"] is not None else None


async def _holds(check: Callable[[], bool]) -> bool:
    return check()


async def test_a_gang_release_of_a_claim_an_operator_holds_announces_no_resume(
    api: httpx.AsyncClient, preemptor: Preemptor, gang: Gang
) -> None:
    """Before, the gang's release published the claim's `resumed` event though its vGPUs
    stayed suspended (the operator's hold): a watcher was told it ran again, and the
    operator's resume then said so a second time."""
    first, _ = gang.cards
    assert (await api.post(f"/v1/claims/{gang.claim_id}/suspend")).status_code == 200
    await handled(preemptor, gang.hp[first].launch_begin)
    await handled(preemptor, gang.hp[first].launch_end)
    assert gang.suspended() == [True, True]
    assert (await api.post(f"/v1/claims/{gang.claim_id}/resume")).status_code == 200
    await eventually(lambda: _holds(lambda: bool(gang.resumed)))
    assert gang.suspended() == [False, False]
    assert len(gang.resumed) == 1, gang.resumed


async def test_a_restarted_preemptor_ends_the_gang_record_of_a_claim_an_operator_holds(
    api: httpx.AsyncClient, preemptor: Preemptor, restartable: Restarts, gang: Gang
) -> None:
    """The card goes idle while no preemptor runs. Before, a restarted preemptor left out the
    gang records of operator-held claims, so the card's announced idle found nothing held
    and the record stayed open for good (`busy_gpus` naming an idle card; the operator's
    resume ends only its own record)."""
    first, _ = gang.cards
    assert (await api.post(f"/v1/claims/{gang.claim_id}/suspend")).status_code == 200
    await handled(preemptor, gang.hp[first].launch_begin)
    await restartable.stop()
    gang.hp[first].launch_end()
    await restartable.start()
    await handled_both_cards(preemptor)

    async def gang_record_ended() -> bool:
        records = (await api.get("/v1/preemptions", params={"claim": gang.claim_id})).json()
        return sorted((r["kind"], r["ended_at"] is None) for r in records) == [
            ("gang", False), ("operator", True)
        ]  # fmt: skip

    await eventually(gang_record_ended, within_s=20)
    assert (gang.suspended(), gang.resumed) == ([True, True], [])
