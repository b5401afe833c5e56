"""An admin asks a card's compute timeslice over REST (`timeslice` in
`PATCH /v1/gpus/{uuid}/sharing`): the node agent sets it on that card with nvidia-smi (a fake
nvidia-smi here records its arguments), on a thread of its own so that a slow nvidia-smi never
holds the apply; withdrawn, the card takes the agent's level again; a card that refuses it is
reported with why, and the rest of the sharing still applies."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from qshare.contracts.sharing import SharingSettings, WantedSharing
from qshare_driver import Node, Policy
from qshare_node_agent.asked_sharing import SharingKeeper
from qshare_node_agent.discovery import Card
from qshare_node_agent.settings import NodeAgentSettings

from .conftest import StartAgent, eventually
from .test_agent_timeslice import calls, fake_smi
from .test_asked_sharing import applied, ask
from .test_cli_claims import qshare

CARD = Card(0, "GPU-timeslice-0", "qshare-simulated", 16384, 0)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    with Node.create(f"ts-{os.getpid()}", tmp_path) as created:
        created.add_card(CARD.index, CARD.uuid, CARD.memory_mib << 20)
        yield created


def keeper(node: Node, program: Path, own: str = "driver") -> SharingKeeper:
    """A keeper of an agent on real cards (no --simulate) whose nvidia-smi is `program`."""
    settings = NodeAgentSettings(name="n1", timeslice=own, nvidia_smi=str(program))
    return SharingKeeper(node, settings, {CARD.uuid: CARD})


def give(kept: SharingKeeper, **asked: Any) -> list[Any]:
    """Apply `asked` to the card (nothing: withdraw it) and wait for the timeslice setter."""
    wanted = [WantedSharing(gpu=CARD.uuid, settings=SharingSettings(**asked))] if asked else []
    refused = kept.apply(wanted)
    if kept.pending_timeslice is not None:
        kept.pending_timeslice.result(timeout=30)
    return refused


def timeslice(kept: SharingKeeper) -> tuple[Any, Any]:
    reported = kept.report()[0]
    return reported.timeslice, reported.timeslice_refused


def test_a_timeslice_asked_is_set_on_the_card_by_its_uuid(node: Node, tmp_path: Path) -> None:
    kept = keeper(node, fake_smi(tmp_path))
    assert give(kept, timeslice="short") == []
    assert calls(tmp_path) == [f"compute-policy -i {CARD.uuid} --set-timeslice 1"]
    assert timeslice(kept) == ("short", None)


def test_a_change_that_keeps_the_asked_timeslice_runs_nvidia_smi_no_more(
    node: Node, tmp_path: Path
) -> None:
    kept = keeper(node, fake_smi(tmp_path))
    give(kept, timeslice="medium")
    give(kept, timeslice="medium", policy="fixed-share")
    assert len(calls(tmp_path)) == 1
    assert node.card_stats(CARD.index).policy == Policy.FIXED_SHARE


def test_withdrawing_it_gives_the_card_the_agents_level_again(node: Node, tmp_path: Path) -> None:
    kept = keeper(node, fake_smi(tmp_path), own="long")
    give(kept, timeslice="short")
    give(kept)
    assert calls(tmp_path)[-1] == f"compute-policy -i {CARD.uuid} --set-timeslice 3"
    assert timeslice(kept) == ("long", None)


def test_withdrawing_it_where_the_agent_sets_none_gives_the_card_nvidia_smis_default(
    node: Node, tmp_path: Path
) -> None:
    kept = keeper(node, fake_smi(tmp_path))
    give(kept, timeslice="long")
    give(kept)
    assert calls(tmp_path)[-1] == f"compute-policy -i {CARD.uuid} --set-timeslice 0"
    assert timeslice(kept) == ("default", None)


def test_a_timeslice_the_card_refuses_is_reported_with_why_and_the_rest_applies(
    node: Node, tmp_path: Path
) -> None:
    program = fake_smi(tmp_path, fail_on=CARD.uuid)
    kept = keeper(node, program)
    assert give(kept, timeslice="short", policy="burst-share") == []
    why = f"short: {program} exited with status 4: Insufficient Permissions"
    assert timeslice(kept) == ("driver", why)
    assert node.card_stats(CARD.index).policy == Policy.BURST_SHARE


def test_a_slow_nvidia_smi_does_not_hold_the_apply(node: Node, tmp_path: Path) -> None:
    go = tmp_path / "go"
    program = fake_smi(tmp_path, body=f"while [ ! -e {go} ]; do sleep 0.05; done")
    kept = keeper(node, program)
    wanted = [WantedSharing(gpu=CARD.uuid, settings=SharingSettings(timeslice="long"))]
    assert kept.apply(wanted) == []
    pending = kept.pending_timeslice
    assert pending is not None and not pending.done()
    go.touch()
    pending.result(timeout=30)
    assert timeslice(kept) == ("long", None)


@pytest.mark.parametrize(
    ("own", "left"),
    [("driver", ("driver", None)), ("short", ("driver", "short: not applied to simulated cards"))],
)
def test_withdrawing_it_on_simulated_cards_leaves_them_as_at_the_start(
    node: Node, tmp_path: Path, own: str, left: tuple[str, str | None]
) -> None:
    """Nothing was ever set on a simulated card, so withdrawing gives nothing back: it is
    reported as the agent's start left it, not as refusing a `default` no one asked (which
    `qshare gpus reset-sharing` on `qshare up`'s nodes showed before)."""
    settings = NodeAgentSettings(name="n1", simulate="1", timeslice=own)
    kept = SharingKeeper(node, settings, {CARD.uuid: CARD})
    give(kept, timeslice="long")
    assert timeslice(kept) == ("driver", "long: not applied to simulated cards")
    give(kept)
    assert timeslice(kept) == left


async def test_a_simulated_cards_node_reports_why_it_did_not_take_the_timeslice(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    agent = await start_agent()
    gpu = agent.cards[0].uuid
    answer = await ask(api, gpu, timeslice="short", policy="fixed-share")
    assert answer["sharing_requested"]["timeslice"] == "short"
    card = await applied(api, gpu)
    assert card["sharing_refused"] is None
    assert card["sharing"]["policy"] == "fixed-share"

    async def reported() -> bool:
        sharing = (await api.get(f"/v1/gpus/{gpu}")).json()["sharing"]
        return bool(sharing["timeslice_refused"] == "short: not applied to simulated cards")

    await eventually(reported)


async def test_a_timeslice_that_is_no_level_is_refused_naming_the_field(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    agent = await start_agent()
    gpu = agent.cards[0].uuid
    response = await api.patch(f"/v1/gpus/{gpu}/sharing", json={"timeslice": "driver"})
    assert response.status_code == 422
    assert "timeslice" in response.text
    assert (await api.get(f"/v1/gpus/{gpu}")).json()["sharing_requested"] is None


async def test_the_cli_asks_a_cards_timeslice_and_shows_it_asked(
    api_url: str, start_agent: StartAgent, capsys: pytest.CaptureFixture[str]
) -> None:
    agent = await start_agent()
    gpu = agent.cards[0].uuid
    assert (
        await qshare(api_url, "gpus", "share", gpu, "--timeslice", "medium", "--wait", "20s") == 0
    )
    row = next(line for line in capsys.readouterr().out.splitlines() if "timeslice" in line)
    assert row.split()[-1] == "medium"
