"""A container holding two vGPUs on one card (two claims, or two requests of one claim, the
scheduler put on the same card): a process is served by one vGPU per card, the lower id, and
a process started without that one's variable by the other. Before, the whole set was
refused and every CUDA call of every process failed. The cards are the fake driver's (a test
double)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import CARD_UUID, GIB, NodeOwner, Probe, run_probe, running_node
from .test_multi_card import SECOND_UUID, cards_env

LOW, HIGH, OTHER = 5, 6, 7  # two vGPUs on card 0, one on card 1
BOTH = {f"QSHARE_VGPU_{HIGH}": CARD_UUID, f"QSHARE_VGPU_{LOW}": CARD_UUID}


@pytest.fixture
def node(cuda_build: Path, tmp_path: Path) -> Iterator[NodeOwner]:
    vgpus = [f"{LOW}:0:low:50:{2 * GIB}", f"{HIGH}:0:low:50:{GIB}", f"{OTHER}:1:low:50:{GIB}"]
    yield from running_node(tmp_path, cards=(CARD_UUID, SECOND_UUID), vgpus=vgpus)


def holding(node: NodeOwner, vgpus: dict[str, str], device: int) -> Probe:
    """A process of the container with `vgpus`, on `device`, holding half a GiB there."""
    probe = Probe(node, 0, extra_env=cards_env(vgpus))
    assert probe.ask(f"init {device}")["rc"] == "0"
    assert probe.ask(f"alloc plain {GIB // 2}")["rc"] == "0"
    return probe


def test_two_vgpus_on_one_card_serve_the_process_by_the_lower_id(node: NodeOwner) -> None:
    probe = holding(node, BOTH, 0)
    assert int(probe.ask("meminfo 0")["total"]) == 2 * GIB  # vGPU 5's limit
    assert (node.stats(LOW)["mem_used"], node.stats(HIGH)["mem_used"]) == (GIB // 2, 0)
    probe.close()


def test_a_shared_card_is_said_once_naming_the_vgpu_that_serves(node: NodeOwner) -> None:
    run = run_probe(node, None, ["init 0", "launch kernel 0 1"], extra_env=cards_env(BOTH))
    assert (run.rc("init"), run.rc("launch")) == (0, 0)
    assert f"served by vGPU {LOW}" in run.stderr and run.stderr.count("qshare:") == 1


def test_a_process_started_without_the_lower_ids_variable_is_served_by_the_other(
    node: NodeOwner,
) -> None:
    probe = holding(node, {f"QSHARE_VGPU_{HIGH}": CARD_UUID}, 0)
    assert (node.stats(LOW)["mem_used"], node.stats(HIGH)["mem_used"]) == (0, GIB // 2)
    probe.close()


def test_a_shared_card_leaves_the_sets_other_cards_served(node: NodeOwner) -> None:
    probe = holding(node, {**BOTH, f"QSHARE_VGPU_{OTHER}": SECOND_UUID}, 1)
    assert node.stats(OTHER)["mem_used"] == GIB // 2
    probe.close()
