"""What the interposer asks the driver per launch: whether the stream is being captured into a
graph, except for the legacy default stream, which can never be (the driver refuses to begin
a capture on it). Counted by the fake driver for the launching thread (the completion
threads ask about the legacy stream before recording a fence into it, once per round, not
per launch: see test_graph_capture.py)."""

from __future__ import annotations

import pytest

from .conftest import HP_VGPU, LP_VGPU, NodeOwner, run_probe


def capture_queries(node: NodeOwner, vgpu: int, launches: list[str]) -> int:
    run = run_probe(node, vgpu, ["init", *launches, "sync", "captures"])
    assert run.returncode == 0, run.stderr
    assert all(run.rc("launch", i) == 0 for i in range(len(launches)))
    return int(run.reply("captures")["n"])


@pytest.mark.parametrize("vgpu", [LP_VGPU, HP_VGPU])
def test_launches_into_the_legacy_default_stream_ask_nothing_about_capture(
    node: NodeOwner, vgpu: int
) -> None:
    assert capture_queries(node, vgpu, ["launch default 0 100", "launch legacy 100 100"]) == 0


def test_launches_into_a_created_stream_ask_whether_it_is_capturing(node: NodeOwner) -> None:
    assert capture_queries(node, LP_VGPU, ["launch kernel 0 100"]) >= 100
