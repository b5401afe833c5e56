"""A process whose vGPU cannot be found is told why, and its CUDA calls fail with an
error code; it never runs unlimited."""

from __future__ import annotations

import pytest

from .conftest import NodeOwner, run_probe

NOT_INITIALIZED = 3
COMMANDS = ["init", "alloc plain 4096", "launch kernel 0 1", "meminfo"]


def test_unknown_vgpu_is_named_in_a_message(node: NodeOwner) -> None:
    run = run_probe(node, 99, COMMANDS)
    assert "cannot attach to vGPU 99" in run.stderr


@pytest.mark.parametrize("vgpu", [99, None])
def test_cuda_calls_fail_without_a_vgpu(node: NodeOwner, vgpu: int | None) -> None:
    run = run_probe(node, vgpu, COMMANDS)
    assert run.returncode == 0
    assert [int(r["rc"]) for r in run.replies] == [NOT_INITIALIZED] * len(COMMANDS)


def test_missing_vgpu_variable_is_explained(node: NodeOwner) -> None:
    run = run_probe(node, None, ["init"])
    assert "QSHARE_VGPU is not set" in run.stderr


def test_malformed_vgpu_variable_is_explained(node: NodeOwner) -> None:
    run = run_probe(node, None, ["init"], extra_env={"QSHARE_VGPU": "two"})
    assert "QSHARE_VGPU=two is not a vGPU id" in run.stderr
    assert run.rc("init") == NOT_INITIALIZED


def test_missing_segment_is_explained(node: NodeOwner) -> None:
    run = run_probe(node, 1, ["init"], extra_env={"QSHARE_SEGMENT": "no-such-segment"})
    assert "segment 'no-such-segment'" in run.stderr
    assert run.rc("init") == NOT_INITIALIZED


def test_a_negative_vgpu_id_that_wraps_to_another_is_refused(node: NodeOwner) -> None:
    """strtoul reads '-18446744073709551615' as 1 (negated modulo 2^64): the program must not
    be attached to vGPU 1 for it."""
    text = "-18446744073709551615"
    run = run_probe(node, None, ["init"], extra_env={"QSHARE_VGPU": text})
    assert f"QSHARE_VGPU={text} is not a vGPU id" in run.stderr
    assert run.rc("init") == NOT_INITIALIZED
