"""The fake CUDA driver (a test double) answers as the real driver does where the interposer
or its tests depend on it: what it leaves untouched when it refuses, and graph capture."""

from __future__ import annotations

from .conftest import LP_VGPU, NodeOwner, run_probe


def test_refused_device_pointer_of_unregistered_memory_leaves_the_callers_pointer(
    node: NodeOwner,
) -> None:
    run = run_probe(node, LP_VGPU, ["init", "hostptr"])
    assert run.rc("hostptr") == 1  # CUDA_ERROR_INVALID_VALUE
    assert run.reply("hostptr")["kept"] == "1"


def test_a_capture_that_nothing_disturbs_ends_with_its_graph(node: NodeOwner) -> None:
    run = run_probe(node, LP_VGPU, ["init", "capture begin", "sleep 5", "capture end"])
    assert run.rc("capture", 0) == 0 and run.rc("capture", 1) == 0
