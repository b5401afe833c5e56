"""A vGPU created suspended (Node.create_vgpu(..., suspended=True)) holds the first launch of
a process that attaches right after the create until it is resumed."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnContext, SpawnProcess
from pathlib import Path

from qshare_driver import Client, EventKind, Node
from qshare_driver.client import now_ns

GiB = 1 << 30
SYS_FUTEX = {"x86_64": 202, "aarch64": 98}[platform.machine()]


def _attach_and_launch(name: str, directory: str, vgpu_id: int, out: Connection) -> None:
    """A one-thread workload process: attach, say so, launch once, report when it unblocked."""
    with Client.attach(name, vgpu_id, directory) as c:
        out.send("attached")
        c.launch_begin()
        out.send(c.last_unblock_ns)
        c.launch_end()


def _asleep_in_futex(pid: int) -> bool:
    """The process's only thread sleeps in a futex wait: for a low-priority launch on an idle
    card with no sharing policy, the wait on its vGPU's suspended word."""
    fields = Path(f"/proc/{pid}/syscall").read_text().split()
    return bool(fields) and fields[0] == str(SYS_FUTEX)


def _wait_held_or_done(proc: SpawnProcess, conn: Connection) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not conn.poll(0):
        if _asleep_in_futex(proc.pid or 0):
            return
        time.sleep(0.001)


def test_a_vgpu_created_suspended_holds_the_first_launch_until_resumed(
    node: Node, ctx: SpawnContext, spawn: Callable[..., SpawnProcess]
) -> None:
    node.create_vgpu(1, 0, "low", 50, GiB, suspended=True)
    assert node.vgpu_stats(1).suspended
    mine, theirs = ctx.Pipe()
    proc = spawn(_attach_and_launch, node.name, str(node.directory), 1, theirs)
    assert mine.recv() == "attached"
    _wait_held_or_done(proc, mine)
    t_resume = now_ns()
    node.resume(1)
    unblocked_ns = mine.recv()
    proc.join(10)
    assert unblocked_ns >= t_resume  # 0 had the launch never waited
    assert node.vgpu_stats(1).launches == 1
    kinds = [e.kind for e in node.events(0.2)]
    assert kinds[:2] == [EventKind.SUSPENDED, EventKind.ATTACH]


def test_a_vgpu_created_without_the_flag_runs(node: Node) -> None:
    node.create_vgpu(2, 0, "low", 50, GiB)
    assert not node.vgpu_stats(2).suspended
    with Client.attach(node.name, 2, node.directory) as c:
        with c.launch():
            pass
        assert c.last_unblock_ns == 0
