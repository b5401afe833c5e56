"""An operator cordons a node for maintenance: nothing new is placed there, what runs keeps
running, a registration does not undo it, and uncordoning places what waited."""

from __future__ import annotations

import httpx
import pytest

from .conftest import StartAgent, claim_until, create_claim, ready_claim
from .test_cli_claims import qshare


async def _schedulable(api: httpx.AsyncClient, node: str, value: bool) -> httpx.Response:
    return await api.patch(f"/v1/nodes/{node}", json={"schedulable": value})


async def test_a_cordoned_node_takes_no_new_claim_and_keeps_its_own(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    agent = await start_agent(cards=1)
    running = await ready_claim(api)
    cordoned = await _schedulable(api, agent.settings.name, False)
    assert (cordoned.status_code, cordoned.json()["schedulable"]) == (200, False)
    waiting = await create_claim(api)
    assert waiting["status"] == "pending"
    assert "schedulable" in waiting["reason"]
    assert (await api.get(f"/v1/claims/{running['id']}")).json()["status"] == "ready"


async def test_uncordoning_places_the_claims_that_waited(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    agent = await start_agent(cards=1)
    await _schedulable(api, agent.settings.name, False)
    waiting = await create_claim(api)
    assert (await _schedulable(api, agent.settings.name, True)).status_code == 200
    await claim_until(api, waiting["id"], "ready")


async def test_a_registration_keeps_the_cordon(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    agent = await start_agent(cards=1)
    await _schedulable(api, agent.settings.name, False)
    again = await api.post("/v1/nodes", json=agent.registration().model_dump(mode="json"))
    assert again.status_code == 200, again.text
    assert (await api.get(f"/v1/nodes/{agent.settings.name}")).json()["schedulable"] is False


async def test_cordoning_an_unknown_node_is_404(api: httpx.AsyncClient) -> None:
    assert (await _schedulable(api, "no-such-node", False)).status_code == 404


async def test_the_cli_shows_a_cordoned_node_as_scheduling_disabled(
    api_url: str, start_agent: StartAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    agent = await start_agent(cards=1)
    assert await qshare(api_url, "nodes", "cordon", agent.settings.name) == 0
    assert "Ready,SchedulingDisabled" in capsys.readouterr().out
    assert await qshare(api_url, "nodes", "uncordon", agent.settings.name) == 0
    assert "SchedulingDisabled" not in capsys.readouterr().out
