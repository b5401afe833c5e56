"""Every way a program reaches the driver arrives at the interposer: direct linking,
runtime-style cuGetProcAddress (legacy and per-thread-stream variants) and dlsym."""

from __future__ import annotations

import pytest

from .conftest import LP_LIMIT, LP_VGPU, NodeOwner, run_probe

STYLES = ["direct", "runtime", "runtime-per-thread"]


@pytest.mark.parametrize("style", STYLES)
def test_allocation_over_the_limit_is_refused_whatever_the_lookup(
    node: NodeOwner, style: str
) -> None:
    run = run_probe(node, LP_VGPU, ["init", f"alloc plain {LP_LIMIT + 1}"], style=style)
    assert run.rc("init") == 0
    assert run.rc("alloc") == 2  # CUDA_ERROR_OUT_OF_MEMORY


@pytest.mark.parametrize("style", STYLES)
def test_launches_are_counted_whatever_the_lookup(node: NodeOwner, style: str) -> None:
    run = run_probe(node, LP_VGPU, ["init", "launch kernel 0 7", "sync"], style=style)
    assert run.rc("launch") == 0
    assert node.stats(LP_VGPU)["launches"] == 7


@pytest.mark.parametrize("style", STYLES)
def test_memory_info_shows_the_slice_whatever_the_lookup(node: NodeOwner, style: str) -> None:
    run = run_probe(node, LP_VGPU, ["init", "meminfo"], style=style)
    assert int(run.reply("meminfo")["total"]) == LP_LIMIT
