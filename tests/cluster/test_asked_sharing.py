"""An admin asks over REST how a card is shared (`PATCH /v1/gpus/{uuid}/sharing`): the
control plane keeps it and sends it to the node agent with the node's desired state, so it
reaches the card at once and again after the agent restarts; what a request leaves out keeps
what was asked before; withdrawing it gives the card the agent's settings back; the API shows
it pending until the node has applied it, and the node's reason when it could not."""

from __future__ import annotations

import argparse
from typing import Any

import httpx
import pytest
from nats.aio.client import Client as Nats

from qshare.cli import main
from qshare.contracts.domain import APPLY_SHARING_FEATURE, agent_features
from qshare_api.cli_sharing import duration
from qshare_driver import Policy
from qshare_node_agent.app import NodeAgent
from qshare_node_agent.commands import PolicyCommand

from .conftest import StartAgent, eventually
from .test_cli_claims import qshare
from .test_node_commands import set_policy

SOME_CARD = "GPU-00000000-0000-0000-0000-000000000000"
"""A card the CLI never asks about: it refuses the arguments first."""


async def ask(api: httpx.AsyncClient, gpu: str, **change: Any) -> dict[str, Any]:
    response = await api.patch(f"/v1/gpus/{gpu}/sharing", json=change)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def applied(api: httpx.AsyncClient, gpu: str) -> dict[str, Any]:
    """The card once its node has applied what was asked of it."""
    found: dict[str, Any] = {}

    async def done() -> bool:
        found.update((await api.get(f"/v1/gpus/{gpu}")).json())
        return found["sharing_pending"] is False

    await eventually(done)
    return found


def policy_of(agent: NodeAgent, card: int) -> Policy:
    return agent.node.card_stats(agent.cards[card].index).policy


async def test_a_policy_asked_over_rest_reaches_the_card(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    agent = await start_agent()
    await ask(api, agent.cards[0].uuid, policy="fixed-share")
    card = await applied(api, agent.cards[0].uuid)
    assert policy_of(agent, 0) == Policy.FIXED_SHARE
    assert card["sharing"]["policy"] == "fixed-share"


async def test_only_the_card_asked_changes(api: httpx.AsyncClient, start_agent: StartAgent) -> None:
    agent = await start_agent()
    await ask(api, agent.cards[0].uuid, policy="burst-share")
    await applied(api, agent.cards[0].uuid)
    assert policy_of(agent, 1) == Policy.BEST_EFFORT


async def test_the_answer_shows_the_request_at_once_and_the_card_once_its_node_applied_it(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    agent = await start_agent()
    answer = await ask(api, agent.cards[0].uuid, lp_window_s=0.0002)
    assert answer["sharing_requested"]["lp_window_s"] == 0.0002
    card = await applied(api, agent.cards[0].uuid)
    assert card["sharing"]["lp_window_s"] == 0.0002


async def test_what_a_request_leaves_out_keeps_what_was_asked_before(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    agent = await start_agent()
    gpu = agent.cards[0].uuid
    await ask(api, gpu, policy="fixed-share")
    answer = await ask(api, gpu, lp_window_s=0.0003)
    assert (answer["sharing_requested"]["policy"], answer["sharing_requested"]["lp_window_s"]) == (
        "fixed-share",
        0.0003,
    )
    await applied(api, gpu)
    stats = agent.node.card_stats(agent.cards[0].index)
    assert (stats.policy, stats.lp_window_s) == (Policy.FIXED_SHARE, 0.0003)


async def test_auto_release_asked_over_rest_puts_the_card_in_auto_mode(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    agent = await start_agent()
    gpu = agent.cards[0].uuid
    await ask(api, gpu, release_mode="auto", release_auto_bound_s=0.002, release_delay_s=0.05)
    await applied(api, gpu)
    auto = agent.node.release_auto(agent.cards[0].index)
    assert (auto.enabled, auto.p99_bound_s, auto.max_delay_s) == (True, 0.002, 0.05)


async def test_a_restarted_agent_gives_the_card_what_was_asked_again(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    first = await start_agent(keep_segment_on_stop=True)
    gpu = first.cards[0].uuid
    await ask(api, gpu, policy="fixed-share")
    await applied(api, gpu)
    await first.stop()
    again = await start_agent(name=first.name)  # adopts the segment with its own settings

    async def asked_again() -> bool:
        return policy_of(again, 0) == Policy.FIXED_SHARE

    await eventually(asked_again)
    assert (await applied(api, gpu))["sharing"]["policy"] == "fixed-share"


async def test_withdrawing_the_request_gives_the_card_the_agents_settings_back(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    agent = await start_agent(policy="burst-share")
    gpu = agent.cards[0].uuid
    await ask(api, gpu, policy="fixed-share")
    await applied(api, gpu)
    answer = (await api.delete(f"/v1/gpus/{gpu}/sharing")).json()
    assert answer["sharing_requested"] is None
    card = await applied(api, gpu)
    assert policy_of(agent, 0) == Policy.BURST_SHARE
    assert card["sharing"]["policy"] == "burst-share"


async def test_a_policy_command_on_another_card_stays_when_one_card_is_asked(
    api: httpx.AsyncClient, nc: Nats, start_agent: StartAgent
) -> None:
    agent = await start_agent()
    await set_policy(nc, agent.name, PolicyCommand(gpu=agent.cards[1].uuid, policy="burst-share"))
    await ask(api, agent.cards[0].uuid, policy="fixed-share")
    await applied(api, agent.cards[0].uuid)
    assert policy_of(agent, 1) == Policy.BURST_SHARE


async def test_a_request_the_node_cannot_apply_is_shown_with_its_reason(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    agent = await start_agent(release_delay_s=0)  # auto release has no delay to choose up to
    gpu = agent.cards[0].uuid
    await ask(api, gpu, release_mode="auto", release_auto_bound_s=0.002)
    card = await applied(api, gpu)
    assert "release_delay_s" in card["sharing_refused"]
    assert not agent.node.release_auto(agent.cards[0].index).enabled


async def test_a_new_request_clears_the_nodes_earlier_refusal(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    agent = await start_agent(release_delay_s=0)
    gpu = agent.cards[0].uuid
    await ask(api, gpu, release_mode="auto", release_auto_bound_s=0.002)
    await applied(api, gpu)
    await ask(api, gpu, release_mode="fixed", policy="fixed-share")
    card = await applied(api, gpu)
    assert card["sharing_refused"] is None
    assert policy_of(agent, 0) == Policy.FIXED_SHARE


async def test_asking_auto_release_without_a_bound_is_refused_naming_it(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    agent = await start_agent()
    gpu = agent.cards[0].uuid
    response = await api.patch(f"/v1/gpus/{gpu}/sharing", json={"release_mode": "auto"})
    assert response.status_code == 422
    assert "release_auto_bound_s" in response.text
    assert (await api.get(f"/v1/gpus/{gpu}")).json()["sharing_requested"] is None


async def test_the_cli_asks_a_cards_sharing_and_waits_until_the_node_applied_it(
    api_url: str, start_agent: StartAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    agent = await start_agent()
    gpu = agent.cards[0].uuid
    args = ("gpus", "share", gpu, "--policy", "fixed-share", "--lp-window", "300us")
    assert await qshare(api_url, *args, "--wait", "20s") == 0
    assert policy_of(agent, 0) == Policy.FIXED_SHARE
    assert agent.node.card_stats(agent.cards[0].index).lp_window_s == 0.0003
    assert ": applied" in capsys.readouterr().out


async def test_the_cli_turns_the_device_gate_on_with_on(
    api_url: str, start_agent: StartAgent
) -> None:
    agent = await start_agent()
    args = ("gpus", "share", agent.cards[0].uuid, "--lp-device-gate", "on", "--wait", "20s")
    assert await qshare(api_url, *args) == 0
    assert agent.node.card_stats(agent.cards[0].index).lp_device_gate is True


async def test_the_cli_wait_ends_with_the_nodes_reason_when_it_refuses(
    api_url: str, start_agent: StartAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    agent = await start_agent(release_delay_s=0)
    args = ("gpus", "share", agent.cards[0].uuid, "--release-mode", "auto")
    rc = await qshare(api_url, *args, "--release-auto-bound", "2ms", "--wait", "20")
    assert rc == 1
    assert "its node refused it" in capsys.readouterr().err


async def test_the_cli_resets_a_card_to_the_agents_settings(
    api: httpx.AsyncClient, api_url: str, start_agent: StartAgent
) -> None:
    agent = await start_agent()
    gpu = agent.cards[0].uuid
    await ask(api, gpu, policy="burst-share")
    await applied(api, gpu)
    assert await qshare(api_url, "gpus", "reset-sharing", gpu, "--wait", "20") == 0
    assert policy_of(agent, 0) == Policy.BEST_EFFORT


async def test_the_cli_refuses_a_share_that_asks_nothing(
    api_url: str, start_agent: StartAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    agent = await start_agent()
    assert await qshare(api_url, "gpus", "share", agent.cards[0].uuid) == 2
    assert "name at least one of --policy" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "seconds"), [("500us", 0.0005), ("2ms", 0.002), ("0.1", 0.1), ("3s", 3.0)]
)
def test_the_cli_reads_durations_with_their_unit(text: str, seconds: float) -> None:
    assert duration(text) == pytest.approx(seconds)


def test_the_cli_refuses_a_duration_it_cannot_read() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="is not a duration"):
        duration("fast")


def test_the_cli_refuses_a_negative_duration() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="must be ≥ 0"):
        duration("-1ms")


@pytest.mark.parametrize("typed", [("--release-delay=-1ms",), ("--release-delay", "-1ms")])
def test_a_negative_release_delay_is_refused_naming_the_option(
    typed: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["gpus", "share", SOME_CARD, *typed])
    assert "argument --release-delay: must be ≥ 0, not '-1ms'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("verb", "option"),
    [
        ("share", "--release-auto-bound"),
        ("share", "--lp-window"),
        ("share", "--wait"),
        ("reset-sharing", "--wait"),
    ],
)
def test_every_duration_option_refuses_a_negative_one_by_name(
    verb: str, option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["gpus", verb, SOME_CARD, option, "-2s"])
    assert f"argument {option}: must be ≥ 0, not '-2s'" in capsys.readouterr().err


async def test_an_agent_announces_that_it_takes_sharing_requests(start_agent: StartAgent) -> None:
    """In its registration's labels, beside the operator's (which may not name it:
    test_agent_own_settings)."""
    agent = await start_agent(labels={"zone": "a"})
    labels = agent.registration().labels
    assert APPLY_SHARING_FEATURE in agent_features(labels)
    assert labels["zone"] == "a"
