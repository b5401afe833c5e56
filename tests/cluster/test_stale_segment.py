"""A node agent upgraded to a driver of another segment layout (ABI) finds its predecessor's
segment, which it cannot adopt: it replaces it when no process uses it any more, and
otherwise refuses to start, naming the processes to stop first and leaving the segment as
it is."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from qshare_driver import Node, SegmentMismatchError
from qshare_node_agent.discovery import Card
from qshare_node_agent.segment import open_segment
from qshare_node_agent.settings import NodeAgentSettings
from qshare_node_agent.stale_segment import (
    Holders,
    StaleSegmentInUse,
    cfg_path,
    holders,
    refusal,
)

CARD = Card(0, "GPU-stale-0", "qshare-simulated", 16384, 0)
ABI_OFFSET = 8
"""Where a part's ABI version is: after its 64-bit magic."""


def agent_settings(tmp_path: Path) -> NodeAgentSettings:
    return NodeAgentSettings(name=f"stale-{os.getpid()}", simulate="1:16Gi", shm_dir=tmp_path)


def leave_stale_segment(settings: NodeAgentSettings) -> Path:
    """A segment as an agent of ABI version 1 would have left it, no process attached."""
    node = Node.create(settings.segment_name, settings.shm_dir)
    node.add_card(CARD.index, CARD.uuid, CARD.memory_mib << 20)
    node.leave()
    return mark_stale(settings)


def mark_stale(settings: NodeAgentSettings) -> Path:
    """Mark a left segment's configuration part with ABI version 1; its path."""
    path = cfg_path(settings.shm_dir, settings.segment_name)
    with path.open("r+b") as part:
        part.seek(ABI_OFFSET)
        part.write((1).to_bytes(4, sys.byteorder))
    return path


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[tuple[NodeAgentSettings, Path, int]]:
    """A stale segment and a process still attached to it, as the earlier agent left them: a
    client keeps the configuration part mapped, not open (the driver closes its descriptor)."""
    settings = agent_settings(tmp_path)
    node = Node.create(settings.segment_name, settings.shm_dir)
    node.add_card(CARD.index, CARD.uuid, CARD.memory_mib << 20)
    node.create_vgpu(1, CARD.index, priority="low", core_share=50, mem_limit=1 << 30)
    code = (
        "import sys, time\n"
        "from qshare_driver import Client\n"
        "client = Client.attach(sys.argv[1], 1, sys.argv[2])\n"
        "print('attached', flush=True)\n"
        "time.sleep(60)\n"
    )
    argv = [sys.executable, "-c", code, settings.segment_name, str(settings.shm_dir)]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "attached"
    node.leave()
    yield settings, mark_stale(settings), child.pid
    child.kill()
    child.wait()


def _unreadable() -> bool:
    """Some process's descriptors cannot be read here (not root): whether a segment is used
    cannot be told, and the agent refuses to replace it (the last tests)."""
    return bool(holders(Path(__file__)).unreadable)


def test_a_segment_of_another_layout_is_what_the_driver_refuses_to_adopt(tmp_path: Path) -> None:
    settings = agent_settings(tmp_path)
    leave_stale_segment(settings)
    with pytest.raises(SegmentMismatchError):
        Node.adopt(settings.segment_name, settings.shm_dir)


@pytest.mark.skipif(_unreadable(), reason="some processes' descriptors cannot be read here")
def test_one_that_no_process_uses_is_replaced_at_start(tmp_path: Path) -> None:
    settings = agent_settings(tmp_path)
    leave_stale_segment(settings)
    node, adopted = open_segment(settings, [CARD])
    with node:
        assert adopted is False
        assert node.list_cards() == [CARD.index]
        node.create_vgpu(1, CARD.index, priority="low", core_share=50, mem_limit=1 << 30)


def test_one_that_a_process_still_holds_is_refused_naming_that_process(
    holder: tuple[NodeAgentSettings, Path, int],
) -> None:
    settings, path, pid = holder
    before = path.read_bytes()
    with pytest.raises(StaleSegmentInUse) as refused:
        open_segment(settings, [CARD])
    assert f"pids {pid}" in str(refused.value)
    assert "stop them (drain the node's GPU workloads)" in str(refused.value)
    assert path.read_bytes() == before


def test_whether_it_is_used_cannot_be_told_when_descriptors_cannot_be_read() -> None:
    said = refusal("s", Path("/dev/shm/qshare.s.cfg"), "ABI 1", Holders(unreadable=[7, 8]))
    assert said is not None
    assert "cannot be told" in said and "2 processes cannot be read (pids 7, 8)" in said


def test_a_refusal_names_five_processes_and_counts_the_rest() -> None:
    said = refusal("s", Path("/x"), "ABI 1", Holders(pids=list(range(100, 108))))
    assert said is not None and "pids 100, 101, 102, 103, 104 and 3 more" in said


def test_nothing_holding_and_everything_readable_lets_it_go() -> None:
    assert refusal("s", Path("/x"), "ABI 1", Holders()) is None
