"""One process of a container holding vGPUs on several cards (a training job of one process
per card, each choosing its card by LOCAL_RANK): QSHARE_VGPU_<ID>=<CARD_UUID> names them, and
the process is served by the vGPU of the card it uses, bound at its first call that needs one.
The cards are the fake driver's (a test double) with two or three devices."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import CARD_UUID, GIB, HP_LIMIT, NodeOwner, Probe, run_probe, running_node

MS = 1_000_000

SECOND_UUID = "GPU-0a1b2c3d-0000-4000-8000-00000000c1de"
THIRD_UUID = "GPU-0a1b2c3d-0000-4000-8000-00000000c2de"
HP0, HP1, LP0, LP1 = 1, 2, 3, 4  # high priority on card 0 and 1; the training job's vGPUs
LP0_LIMIT, LP1_LIMIT = 2 * GIB, 1 * GIB
NOT_INITIALIZED, NOT_PERMITTED = 3, 800
TRAINING = {f"QSHARE_VGPU_{LP0}": CARD_UUID, f"QSHARE_VGPU_{LP1}": SECOND_UUID}


def cards_env(vgpus: dict[str, str], count: int = 2) -> dict[str, str]:
    """The fake driver's `count` devices (card 0, card 1, then one on no vGPU) and `vgpus`."""
    env = {"QSHARE_FAKE_GPU_COUNT": str(count), "QSHARE_FAKE_GPU_UUID_1": SECOND_UUID}
    env["QSHARE_FAKE_GPU_UUID_2"] = THIRD_UUID
    return {**env, **vgpus}


@pytest.fixture
def cards(cuda_build: Path, tmp_path: Path) -> Iterator[NodeOwner]:
    vgpus = [
        f"{HP0}:0:high:100:{HP_LIMIT}",
        f"{HP1}:1:high:100:{HP_LIMIT}",
        f"{LP0}:0:low:50:{LP0_LIMIT}",
        f"{LP1}:1:low:50:{LP1_LIMIT}",
    ]
    yield from running_node(tmp_path, cards=(CARD_UUID, SECOND_UUID), vgpus=vgpus)


def high_priority(node: NodeOwner, vgpu: int, device: int) -> Probe:
    probe = Probe(node, vgpu, extra_env=cards_env({}))
    assert probe.ask(f"init {device}")["rc"] == "0"
    return probe


def training_rank(node: NodeOwner, device: int, vgpus: dict[str, str] = TRAINING) -> Probe:
    # QSHARE_VGPU (a CDI of several devices may set it several times) is ignored once
    # QSHARE_VGPU_<ID> variables are set.
    probe = Probe(node, 0, extra_env={**cards_env(vgpus), "QSHARE_VGPU": "junk"})
    assert probe.ask(f"init {device}")["rc"] == "0"
    return probe


def test_a_process_on_device_1_is_held_by_card_1s_gate(cards: NodeOwner) -> None:
    hp = high_priority(cards, HP1, 1)
    rank = training_rank(cards, 1)
    started = int(hp.ask("launch kernel 300000 1")["start"])  # card 1's HP work, 300 ms
    launch = rank.ask("launch kernel 0 1")
    assert launch["rc"] == "0"
    assert int(launch["t"]) >= started + 300 * MS
    hp.close()
    rank.close()


def test_a_process_on_device_1_is_not_held_by_card_0s_gate(cards: NodeOwner) -> None:
    hp = high_priority(cards, HP0, 0)
    rank = training_rank(cards, 1)
    started = int(hp.ask("launch kernel 300000 1")["start"])  # card 0's HP work, 300 ms
    launch = rank.ask("launch kernel 0 1")
    assert launch["rc"] == "0"
    assert int(launch["t"]) < started + 250 * MS
    hp.close()
    rank.close()


def test_memory_on_device_1_counts_against_card_1s_vgpu(cards: NodeOwner) -> None:
    rank = training_rank(cards, 1)
    assert rank.ask(f"alloc plain {GIB // 2}")["rc"] == "0"
    assert cards.stats(LP1)["mem_used"] == GIB // 2
    assert cards.stats(LP0)["mem_used"] == 0
    rank.close()


def test_several_vgpus_attach_to_none_until_the_first_launch(cards: NodeOwner) -> None:
    rank = training_rank(cards, 1)
    assert cards.stats(LP1)["contexts"] == 0
    assert rank.ask("launch kernel 0 1")["rc"] == "0"
    assert cards.stats(LP1)["contexts"] == 1
    assert cards.stats(LP0)["contexts"] == 0
    rank.close()


def test_one_entry_attaches_at_cuinit(cards: NodeOwner) -> None:
    rank = training_rank(cards, 1, {f"QSHARE_VGPU_{LP1}": SECOND_UUID})
    assert cards.stats(LP1)["contexts"] == 1
    rank.close()


def test_an_entry_on_another_card_than_the_nodes_is_refused(cards: NodeOwner) -> None:
    run = run_probe(cards, None, ["init 1"], extra_env=cards_env({f"QSHARE_VGPU_{LP1}": CARD_UUID}))
    assert run.rc("init") == NOT_INITIALIZED
    assert f"QSHARE_VGPU_{LP1}" in run.stderr and SECOND_UUID in run.stderr


def test_work_on_a_second_card_of_the_set_is_refused(cards: NodeOwner) -> None:
    steps = ["init 1", "launch kernel 0 1", "device 0", "launch kernel 0 1", f"alloc plain {GIB}"]
    run = run_probe(cards, None, steps, extra_env=cards_env(TRAINING))
    assert run.rc("launch", 0) == 0
    assert (run.rc("launch", 1), run.rc("alloc")) == (NOT_PERMITTED, NOT_PERMITTED)
    assert "one card per process" in run.stderr
    assert CARD_UUID in run.stderr and SECOND_UUID in run.stderr
    assert run.stderr.count("qshare:") == 1  # warned once
    assert cards.stats(LP0)["contexts"] == 0


def test_a_device_on_no_vgpu_of_the_set_is_refused(cards: NodeOwner) -> None:
    steps = ["init 2", "launch kernel 0 1", f"alloc plain {GIB}", "meminfo 2"]
    run = run_probe(cards, None, steps, extra_env=cards_env(TRAINING, count=3))
    assert run.rc("launch") == NOT_PERMITTED
    assert run.rc("alloc") == NOT_PERMITTED
    assert run.rc("meminfo") == NOT_PERMITTED
    assert THIRD_UUID in run.stderr and SECOND_UUID in run.stderr and "device 2" in run.stderr
    assert cards.stats(LP0)["contexts"] == cards.stats(LP1)["contexts"] == 0


def test_memory_queries_show_the_bound_vgpu_and_other_cards_as_they_are(
    cards: NodeOwner,
) -> None:
    steps = ["init 1", "meminfo 0", "meminfo 1", "nvml 0", "nvml 1"]
    run = run_probe(cards, None, steps, extra_env=cards_env(TRAINING))
    bound, other = run.reply("meminfo", 1), run.reply("meminfo", 0)
    assert int(bound["total"]) == LP1_LIMIT and int(bound["device_total"]) == LP1_LIMIT
    assert int(other["device_total"]) == 16 * GIB  # card 0 is not this process's vGPU's
    assert int(run.reply("nvml", 1)["total"]) == LP1_LIMIT
    assert int(run.reply("nvml", 0)["total"]) == 16 * GIB


@pytest.mark.parametrize(
    ("vgpus", "named"),
    [
        ({"QSHARE_VGPU_x": CARD_UUID, f"QSHARE_VGPU_{LP1}": SECOND_UUID}, "QSHARE_VGPU_x"),
        (
            {f"QSHARE_VGPU_{LP0}": "GPU-nope", f"QSHARE_VGPU_{LP1}": SECOND_UUID},
            f"QSHARE_VGPU_{LP0}",
        ),
        (
            {f"QSHARE_VGPU_{LP1}": CARD_UUID, f"QSHARE_VGPU_0{LP1}": SECOND_UUID},
            f"QSHARE_VGPU_{LP1}",
        ),
    ],
    ids=["bad-id", "bad-uuid", "duplicate-id"],  # two ids on one card: test_shared_card_set
)
def test_a_malformed_set_is_named_and_fails_cuda_calls(
    cards: NodeOwner, vgpus: dict[str, str], named: str
) -> None:
    run = run_probe(cards, None, ["init 1", "launch kernel 0 1"], extra_env=cards_env(vgpus))
    assert run.rc("init") == NOT_INITIALIZED
    assert named in run.stderr
    assert "CUDA_ERROR_NOT_INITIALIZED" in run.stderr
