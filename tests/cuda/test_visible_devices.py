"""Which cards a process sees: the fake driver (a test double) enumerates the devices
CUDA_VISIBLE_DEVICES names, as the real driver does, and the interposer sets
CUDA_VISIBLE_DEVICES, when nothing set it, to the cards its QSHARE_VISIBLE_<INDEX> variables
name, in index order (how a container given vGPUs of several DRA claims sees all their cards)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from qshare.native_build import TOOLS

from .conftest import CARD_UUID, GIB, NodeOwner, Probe, run_probe, running_node

SECOND_UUID = "GPU-0a1b2c3d-0000-4000-8000-00000000c1de"
THIRD_UUID = "GPU-0a1b2c3d-0000-4000-8000-00000000c2de"
LP0, LP1 = 3, 4  # a training job's vGPUs, on card 0 and card 1
NO_DEVICE = 100
# Two claims' cards as a runtime leaves them: QSHARE_VISIBLE_10 (card 1 of a node whose
# indexes run past 9) comes first in the environment, and sorts after QSHARE_VISIBLE_2 by
# number, not by text.
TWO_CLAIMS = {
    f"QSHARE_VGPU_{LP1}": SECOND_UUID,
    "QSHARE_VISIBLE_10": SECOND_UUID,
    f"QSHARE_VGPU_{LP0}": CARD_UUID,
    "QSHARE_VISIBLE_2": CARD_UUID,
}


def three_devices(extra: dict[str, str]) -> dict[str, str]:
    """The fake driver's three devices: the two cards of the vGPUs and one of neither."""
    env = {"QSHARE_FAKE_GPU_COUNT": "3", "QSHARE_FAKE_GPU_UUID_0": CARD_UUID}
    env |= {"QSHARE_FAKE_GPU_UUID_1": SECOND_UUID, "QSHARE_FAKE_GPU_UUID_2": THIRD_UUID}
    return env | extra


def cards_reply(stdout: str) -> dict[str, str]:
    line = next(x for x in stdout.splitlines() if x.startswith("cards "))
    return dict(pair.split("=", 1) for pair in line.split()[1:] if "=" in pair)


@pytest.fixture
def node(cuda_build: Path, tmp_path: Path) -> Iterator[NodeOwner]:
    vgpus = [f"{LP0}:0:low:50:{2 * GIB}", f"{LP1}:1:low:50:{GIB}"]
    yield from running_node(tmp_path, cards=(CARD_UUID, SECOND_UUID), vgpus=vgpus)


# -- the fake driver alone (no interposer) -------------------------------------------------
def fake_cards(node: NodeOwner, extra: dict[str, str]) -> dict[str, str]:
    env = node.env(None) | three_devices(extra)
    done = subprocess.run([str(TOOLS / "probe-direct"), "cards"], env=env, capture_output=True,
                          text=True, timeout=30)  # fmt: skip
    return cards_reply(done.stdout)


def test_the_fake_driver_enumerates_every_device_when_nothing_is_named(node: NodeOwner) -> None:
    """A guard: unset, every device in index order."""
    seen = fake_cards(node, {})
    assert seen["uuids"] == f"{CARD_UUID},{SECOND_UUID},{THIRD_UUID}"


@pytest.mark.parametrize(
    ("visible", "uuids"),
    [
        (f"{THIRD_UUID},{CARD_UUID}", f"{THIRD_UUID},{CARD_UUID}"),
        ("1,0", f"{SECOND_UUID},{CARD_UUID}"),
        (f"2,GPU-nope,{CARD_UUID}", THIRD_UUID),  # up to the first entry naming no device
        ("0,0,1", CARD_UUID),  # up to the first repeated one
    ],
    ids=["uuids", "indexes", "unknown-entry", "repeated-entry"],
)
def test_the_fake_driver_enumerates_the_devices_named_in_their_order(
    node: NodeOwner, visible: str, uuids: str
) -> None:
    """Before: the fake driver ignored CUDA_VISIBLE_DEVICES and listed all three."""
    seen = fake_cards(node, {"CUDA_VISIBLE_DEVICES": visible})
    assert (seen["rc"], seen["uuids"]) == ("0", uuids)
    assert int(seen["count"]) == len(uuids.split(","))


def test_the_fake_driver_has_no_device_when_none_is_named(node: NodeOwner) -> None:
    seen = fake_cards(node, {"CUDA_VISIBLE_DEVICES": ""})
    assert int(seen["rc"]) == NO_DEVICE


# -- the interposer ------------------------------------------------------------------------
def run_cards(node: NodeOwner, extra: dict[str, str]) -> tuple[dict[str, str], str]:
    run = run_probe(node, None, ["cards"], extra_env=three_devices(extra))
    return run.reply("cards"), run.stderr


def test_the_interposer_shows_the_cards_of_every_claim_in_index_order(node: NodeOwner) -> None:
    """Before: nothing set CUDA_VISIBLE_DEVICES from QSHARE_VISIBLE_<INDEX>, so the process saw
    every device the driver has (three here, the third on no vGPU of it)."""
    probe = Probe(node, 0, extra_env=three_devices(TWO_CLAIMS))
    seen = probe.ask("cards")
    assert seen["visible"] == seen["uuids"] == f"{CARD_UUID},{SECOND_UUID}"
    assert probe.ask("init 1")["rc"] == "0"  # ordinal 1: the second card
    assert probe.ask("launch kernel 0 1")["rc"] == "0"
    assert (node.stats(LP0)["contexts"], node.stats(LP1)["contexts"]) == (0, 1)
    probe.close()


@pytest.mark.parametrize(
    ("visible", "shown", "uuids"),
    [(SECOND_UUID, SECOND_UUID, SECOND_UUID), ("2,0", "2,0", f"{THIRD_UUID},{CARD_UUID}"),
     ("", "(empty)", "")],
    ids=["a-card", "indexes", "empty"],
)  # fmt: skip
def test_a_value_set_on_purpose_is_left_as_it_is(
    node: NodeOwner, visible: str, shown: str, uuids: str
) -> None:
    """A guard: the pod's (or a launcher's) CUDA_VISIBLE_DEVICES wins, even an empty one."""
    seen, _ = run_cards(node, TWO_CLAIMS | {"CUDA_VISIBLE_DEVICES": visible})
    assert (seen["visible"], seen["uuids"]) == (shown, uuids)


def test_without_qshare_visible_nothing_is_set(node: NodeOwner) -> None:
    """A guard: a process started by `qshare run --vgpu`, or by a spec written before
    QSHARE_VISIBLE_<INDEX>, finds CUDA_VISIBLE_DEVICES as it was."""
    seen, _ = run_cards(node, {k: v for k, v in TWO_CLAIMS.items() if "VISIBLE" not in k})
    assert (seen["visible"], seen["count"]) == ("-", "3")


def test_a_card_named_twice_by_two_claims_is_shown_once(node: NodeOwner) -> None:
    """Two claims holding shares of one card both name it: one entry."""
    seen, stderr = run_cards(node, TWO_CLAIMS | {"QSHARE_VISIBLE_02": CARD_UUID})
    assert seen["visible"] == f"{CARD_UUID},{SECOND_UUID}"
    assert "qshare:" not in stderr


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ({"QSHARE_VISIBLE_x": THIRD_UUID}, "QSHARE_VISIBLE_x: 'x' after QSHARE_VISIBLE_ is not"),
        ({"QSHARE_VISIBLE_5": "GPU-nope"}, "QSHARE_VISIBLE_5='GPU-nope' is not a card UUID"),
        ({"QSHARE_VISIBLE_002": THIRD_UUID}, "contradicts"),  # index 2 names two cards
        ({"QSHARE_VISIBLE_7": CARD_UUID}, "contradicts"),  # card 0 has two indexes
    ],
    ids=["bad-index", "bad-uuid", "index-of-two-cards", "card-of-two-indexes"],
)
def test_a_malformed_variable_is_named_and_nothing_is_set(
    node: NodeOwner, bad: dict[str, str], named: str
) -> None:
    seen, stderr = run_cards(node, TWO_CLAIMS | bad)
    assert (seen["visible"], seen["count"]) == ("-", "3")
    assert named in stderr and "CUDA_VISIBLE_DEVICES is left unset" in stderr
