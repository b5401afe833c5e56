"""The node agent sets its cards' compute timeslice with nvidia-smi when
QSHARE_NODE_TIMESLICE asks (a fake nvidia-smi here records its arguments), reports each card
it could not set, and leaves simulated cards and `driver` alone."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from qshare.envsettings import SettingsError, load
from qshare_node_agent.settings import NodeAgentSettings
from qshare_node_agent.timeslice import CardTimeslice, Outcome, apply, set_timeslice

from .conftest import StartAgent, eventually
from .test_cli_claims import qshare

CARDS = ["GPU-aaaa-0001", "GPU-bbbb-0002"]


def fake_smi(tmp_path: Path, fail_on: str = "", body: str = "") -> Path:
    """An executable standing in for nvidia-smi: it appends its arguments to `calls` and
    fails (status 4, two lines on stderr) when they name `fail_on`; `body` runs first."""
    program = tmp_path / "nvidia-smi"
    program.write_text(
        "#!/bin/sh\n"
        f"{body}\n"
        f'echo "$*" >> {tmp_path / "calls"}\n'
        f'case "$*" in *"{fail_on or "@never@"}"*)\n'
        '  echo "Working..." >&2; echo "Insufficient Permissions" >&2; exit 4;;\n'
        "esac\n"
    )
    program.chmod(0o755)
    return program


def calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls"
    return log.read_text().splitlines() if log.exists() else []


def real_cards(program: Path, timeslice: str) -> NodeAgentSettings:
    """Settings of an agent on real cards (no --simulate) with the fake nvidia-smi."""
    return NodeAgentSettings(name="n1", timeslice=timeslice, nvidia_smi=str(program))


def test_each_card_is_set_to_the_short_timeslice_by_its_uuid(tmp_path: Path) -> None:
    outcomes = set_timeslice(str(fake_smi(tmp_path)), CARDS, "short")
    assert calls(tmp_path) == [f"compute-policy -i {uuid} --set-timeslice 1" for uuid in CARDS]
    assert outcomes == [Outcome(uuid) for uuid in CARDS]


def test_driver_runs_nothing(tmp_path: Path) -> None:
    assert set_timeslice(str(fake_smi(tmp_path)), CARDS, "driver") == []
    assert calls(tmp_path) == []


def test_a_failing_program_is_reported_for_its_card_and_the_others_are_still_set(
    tmp_path: Path,
) -> None:
    program = fake_smi(tmp_path, fail_on=CARDS[0])
    outcomes = set_timeslice(str(program), CARDS, "long")
    assert outcomes == [
        Outcome(CARDS[0], f"{program} exited with status 4: Insufficient Permissions"),
        Outcome(CARDS[1]),
    ]
    assert calls(tmp_path)[1] == f"compute-policy -i {CARDS[1]} --set-timeslice 3"


def test_a_missing_program_is_reported_not_raised(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-nvidia-smi")
    outcomes = set_timeslice(missing, CARDS[:1], "medium")
    assert outcomes == [Outcome(CARDS[0], f"{missing} not found")]


def test_a_program_that_does_not_finish_is_reported_after_the_timeout(tmp_path: Path) -> None:
    program = fake_smi(tmp_path, body="exec sleep 30")
    outcomes = set_timeslice(str(program), CARDS[:1], "default", timeout_s=0.3)
    assert outcomes == [Outcome(CARDS[0], f"{program} did not finish within 0.3 s")]


def test_an_unknown_timeslice_is_refused_naming_the_setting_and_the_levels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("QSHARE_NODE_TIMESLICE", "fastest")
    with pytest.raises(SettingsError) as refused:
        load(NodeAgentSettings, {"name": "n1"})
    assert refused.value.problems == [
        "QSHARE_NODE_TIMESLICE='fastest': "
        "Input should be 'driver', 'default', 'short', 'medium' or 'long'"
    ]


def test_the_agent_leaves_the_timeslice_alone_by_default(tmp_path: Path) -> None:
    settings = NodeAgentSettings(name="n1", nvidia_smi=str(fake_smi(tmp_path)))
    assert apply(settings, CARDS) == {uuid: CardTimeslice("driver") for uuid in CARDS}
    assert calls(tmp_path) == []


def test_each_card_is_left_with_the_level_it_took_or_the_level_it_refused_and_why(
    tmp_path: Path,
) -> None:
    settings = real_cards(fake_smi(tmp_path, fail_on=CARDS[1]), "short")
    why = f"{settings.nvidia_smi} exited with status 4: Insufficient Permissions"
    assert apply(settings, CARDS) == {
        CARDS[0]: CardTimeslice("short"),
        CARDS[1]: CardTimeslice("driver", f"short: {why}"),
    }


def test_a_refusal_longer_than_a_heartbeat_takes_is_cut_to_fit(tmp_path: Path) -> None:
    program = fake_smi(tmp_path, body='echo "$(printf "x%.0s" $(seq 1 1500))" >&2; exit 9')
    refused = apply(real_cards(program, "long"), CARDS[:1])[CARDS[0]].refused
    assert refused is not None and len(refused) == 1000
    assert refused.startswith(f"long: {program} exited with status 9: xxx")


def test_each_card_that_refused_is_logged_as_a_warning_naming_it_the_setting_and_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = real_cards(fake_smi(tmp_path, fail_on=CARDS[1]), "short")
    with caplog.at_level(logging.INFO, logger="qshare_node_agent.timeslice"):
        apply(settings, CARDS)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"node agent n1: card {CARDS[1]}: timeslice 'short' (QSHARE_NODE_TIMESLICE) not set: "
        f"{settings.nvidia_smi} exited with status 4: Insufficient Permissions"
    ]


def test_the_metrics_say_which_cards_took_the_timeslice_and_which_refused(
    tmp_path: Path,
) -> None:
    settings = NodeAgentSettings(name="n-metrics", timeslice="medium",
                                 nvidia_smi=str(fake_smi(tmp_path, fail_on=CARDS[1])))  # fmt: skip
    apply(settings, CARDS)
    read = [REGISTRY.get_sample_value("qshare_card_timeslice_set",
                                      {"node": "n-metrics", "gpu": uuid, "level": "medium"})
            for uuid in CARDS]  # fmt: skip
    assert read == [1.0, 0.0]


async def test_an_agent_on_simulated_cards_says_so_and_runs_nothing(
    start_agent: StartAgent, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    program = fake_smi(tmp_path)
    with caplog.at_level(logging.INFO, logger="qshare_node_agent.timeslice"):
        agent = await start_agent(timeslice="short", nvidia_smi=str(program))
    said = [r.getMessage() for r in caplog.records if r.name == "qshare_node_agent.timeslice"]
    assert said == [f"node agent {agent.name}: timeslice 'short' not applied to simulated cards"]
    assert calls(tmp_path) == []


async def served_sharing(api: httpx.AsyncClient, uuid: str) -> dict[str, Any]:
    """The card's sharing once its node has reported it."""
    card: dict[str, Any] = {}

    async def reported() -> bool:
        card.update((await api.get(f"/v1/gpus/{uuid}")).json())
        return card["sharing"] is not None

    await eventually(reported)
    sharing: dict[str, Any] = card["sharing"]
    return sharing


async def test_the_api_serves_a_simulated_cards_timeslice_as_the_drivers_and_says_why(
    start_agent: StartAgent, api: httpx.AsyncClient, tmp_path: Path
) -> None:
    agent = await start_agent(timeslice="medium", nvidia_smi=str(fake_smi(tmp_path)))
    sharing = await served_sharing(api, agent.cards[0].uuid)
    assert (sharing["timeslice"], sharing["timeslice_refused"]) == (
        "driver", "medium: not applied to simulated cards")  # fmt: skip


async def test_the_cli_shows_a_cards_timeslice_and_the_level_it_refused(
    start_agent: StartAgent, api: httpx.AsyncClient, api_url: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    agent = await start_agent(timeslice="long", nvidia_smi=str(fake_smi(tmp_path)))
    await served_sharing(api, agent.cards[0].uuid)
    assert await qshare(api_url, "gpus", "get", agent.cards[0].uuid) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "timeslice" in line)
    assert row.split()[:5] == ["timeslice", "driver", "(refused", "long:", "not"]
