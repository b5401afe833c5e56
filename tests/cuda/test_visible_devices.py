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

from .conftest import CARD_UUID, GIB, NodeOwner, Probe, run_probe, start_node

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
    return dict(pair.split("=", 1) for pair in line.split()[1:])


@pytest.fixture
def node(cuda_build: Path, tmp_path: Path) -> Iterator[NodeOwner]:
    vgpus = [f"{LP0}:0:low:50:{2 * GIB}", f"{LP1}:1:low:50:{GIB}"]
    n = start_node(tmp_path, cards=(CARD_UUID, SECOND_UUID), vgpus=vgpus)
    yield n
    assert n.process.stdin is not None
    n.process.stdin.write("quit\n")
    n.process.stdin.flush()
    n.process.wait(timeout=10)


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
