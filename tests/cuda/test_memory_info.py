"""What the program is shown: the vGPU's limit and use, through CUDA and NVML."""

from __future__ import annotations

from .conftest import CARD_MEM, HP_LIMIT, HP_VGPU, OTHER_UUID, NodeOwner, run_probe

MIB = 1 << 20


def test_mem_get_info_reports_the_limit_and_what_is_left(node: NodeOwner) -> None:
    run = run_probe(node, HP_VGPU, ["init", f"alloc plain {100 * MIB}", "meminfo"])
    info = run.reply("meminfo")
    assert int(info["total"]) == HP_LIMIT
    assert int(info["free"]) == HP_LIMIT - 100 * MIB


def test_device_total_mem_reports_the_limit(node: NodeOwner) -> None:
    run = run_probe(node, HP_VGPU, ["init", "meminfo"])
    assert int(run.reply("meminfo")["device_total"]) == HP_LIMIT


def test_nvml_memory_info_reports_the_slice(node: NodeOwner) -> None:
    run = run_probe(node, HP_VGPU, ["init", f"alloc plain {100 * MIB}", "nvml"])
    nvml = run.reply("nvml")
    assert (int(nvml["total"]), int(nvml["used"])) == (HP_LIMIT, 100 * MIB)
    assert (int(nvml["v2_total"]), int(nvml["v2_used"])) == (HP_LIMIT, 100 * MIB)
    assert int(nvml["v2_free"]) == HP_LIMIT - 100 * MIB


def test_a_card_other_than_the_vgpus_is_shown_as_it_is(node: NodeOwner) -> None:
    run = run_probe(
        node, HP_VGPU, ["init", "meminfo", "nvml"], extra_env={"QSHARE_FAKE_GPU_UUID": OTHER_UUID}
    )
    assert int(run.reply("meminfo")["total"]) == CARD_MEM
    assert int(run.reply("nvml")["total"]) == CARD_MEM
