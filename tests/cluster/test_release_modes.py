"""The release delay and LP window as a platform team sets them through the node agent: the
delay fixed, or `auto` (the driver chooses each card's delay, up to the fixed one, within a
bound on what it may add to high priority's p99), from the agent's settings or at run time
through `cmd.policy`, served in the metrics and, with each heartbeat, by the API; settings
changed for a restart reach the cards of the segment it adopts."""

from __future__ import annotations

import httpx
import pytest
from nats.aio.client import Client as Nats

from qshare.contracts.errors import InvalidInput
from qshare.envsettings import SettingsError, load
from qshare.testing.servers import free_port
from qshare_driver import Policy
from qshare_node_agent.commands import PolicyCommand
from qshare_node_agent.settings import NodeAgentSettings

from .conftest import StartAgent, eventually
from .test_node_commands import set_policy
from .test_node_metrics import scrape

BOUND_S = 0.002


async def test_an_agent_set_to_auto_release_puts_every_card_in_auto_mode(
    start_agent: StartAgent,
) -> None:
    agent = await start_agent(release_auto_bound_s=BOUND_S)
    modes = [agent.node.release_auto(c.index) for c in agent.cards]
    assert [(m.enabled, m.p99_bound_s, m.max_delay_s) for m in modes] == [
        (True, BOUND_S, agent.settings.release_delay_s)
    ] * len(agent.cards)


def test_auto_release_without_a_delay_to_choose_up_to_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("QSHARE_NODE_RELEASE_AUTO_BOUND_S", "0.001")
    monkeypatch.setenv("QSHARE_NODE_RELEASE_DELAY_S", "0")
    with pytest.raises(SettingsError, match="release_delay_s above 0"):
        load(NodeAgentSettings)


async def test_settings_changed_for_a_restart_reach_the_adopted_cards(
    start_agent: StartAgent,
) -> None:
    first = await start_agent(release_auto_bound_s=BOUND_S, keep_segment_on_stop=True)
    await first.stop()
    again = await start_agent(name=first.name, policy="burst-share")  # adopts the segment
    index = again.cards[0].index
    assert again.node.card_stats(index).policy == Policy.BURST_SHARE
    assert not again.node.release_auto(index).enabled


async def test_a_policy_command_turns_auto_release_on_and_reports_it(
    nc: Nats, start_agent: StartAgent
) -> None:
    agent = await start_agent()
    gpu = agent.cards[0].uuid
    command = PolicyCommand(gpu=gpu, release_mode="auto", release_auto_bound_s=BOUND_S)
    reply = await set_policy(nc, agent.name, command)
    assert (reply.release_mode, reply.release_auto_bound_s) == ("auto", BOUND_S)
    assert agent.node.release_auto(agent.cards[0].index).enabled
    assert not agent.node.release_auto(agent.cards[1].index).enabled


async def test_a_policy_command_turns_auto_release_off(nc: Nats, start_agent: StartAgent) -> None:
    agent = await start_agent(release_auto_bound_s=BOUND_S)
    gpu = agent.cards[0].uuid
    reply = await set_policy(nc, agent.name, PolicyCommand(gpu=gpu, release_mode="fixed"))
    assert (reply.release_mode, reply.release_auto_bound_s) == ("fixed", None)
    assert reply.release_delay_in_force_s == agent.settings.release_delay_s


async def test_auto_release_without_a_bound_is_refused_and_changes_nothing(
    nc: Nats, start_agent: StartAgent
) -> None:
    agent = await start_agent()
    command = PolicyCommand(gpu=agent.cards[0].uuid, policy="burst-share", release_mode="auto")
    with pytest.raises(InvalidInput, match="release_auto_bound_s"):
        await set_policy(nc, agent.name, command)
    assert agent.node.card_stats(agent.cards[0].index).policy == Policy.BEST_EFFORT


def test_a_bound_without_auto_release_is_refused() -> None:
    with pytest.raises(ValueError, match="release_auto_bound_s goes with release_mode auto"):
        PolicyCommand(gpu="g", release_auto_bound_s=BOUND_S)


async def test_a_card_in_auto_release_is_served_as_such_with_its_delay_in_force(
    start_agent: StartAgent,
) -> None:
    agent = await start_agent(release_auto_bound_s=BOUND_S, metrics_port=free_port())
    samples = await scrape(agent)
    assert {s.value for s in samples["qshare_card_release_auto"]} == {1}
    delays = {s.value for s in samples["qshare_card_release_delay_seconds"]}
    modes = {agent.node.release_auto(c.index).delay_s for c in agent.cards}
    assert delays == modes


async def test_a_cards_sharing_reaches_the_api_with_the_agents_heartbeats(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    agent = await start_agent(release_auto_bound_s=BOUND_S, lp_window_s=0.0002)

    async def reported() -> bool:
        cards = (await api.get("/v1/gpus", params={"node": agent.name})).json()
        shown = [(c["sharing"] or {}).get("release_mode") for c in cards]
        return shown == ["auto"] * len(agent.cards) and cards[0]["sharing"]["lp_window_s"] == 0.0002

    await eventually(reported)


async def test_a_policy_command_sets_a_cards_lp_window(nc: Nats, start_agent: StartAgent) -> None:
    agent = await start_agent()
    gpu = agent.cards[0].uuid
    reply = await set_policy(nc, agent.name, PolicyCommand(gpu=gpu, lp_window_s=0.0001))
    assert reply.lp_window_s == 0.0001
    assert agent.node.card_stats(agent.cards[0].index).lp_window_s == 0.0001
