"""GroupCommit: handlers of one turn of the event loop share one flush, and each is
answered only after the flush that covers it."""

from __future__ import annotations

import asyncio

import pytest

from qshare_node_agent.kubernetes.group_commit import GroupCommit


class Disk:
    """A flush that records what was on 'disk' each time it ran."""

    def __init__(self) -> None:
        self.changes: list[str] = []
        self.saved: list[list[str]] = []
        self.fail: Exception | None = None

    def flush(self) -> None:
        if self.fail is not None:
            raise self.fail
        self.saved.append(list(self.changes))


async def change_then_wait(disk: Disk, commits: GroupCommit, name: str) -> list[str]:
    disk.changes.append(name)
    await commits.durable()
    return disk.saved[-1]


async def test_callers_of_one_turn_share_one_flush() -> None:
    disk = Disk()
    commits = GroupCommit(disk.flush)
    await asyncio.gather(*(change_then_wait(disk, commits, f"c{i}") for i in range(5)))
    assert commits.flushes == 1
    assert disk.saved == [["c0", "c1", "c2", "c3", "c4"]]


async def test_each_caller_is_answered_after_a_flush_holding_its_change() -> None:
    disk = Disk()
    commits = GroupCommit(disk.flush)
    first = asyncio.ensure_future(change_then_wait(disk, commits, "a"))
    await asyncio.sleep(0.01)  # the first flush has run
    second = await change_then_wait(disk, commits, "b")
    assert await first == ["a"]
    assert second == ["a", "b"]
    assert commits.flushes == 2


async def test_a_caller_arriving_during_a_flush_waits_for_the_next_one() -> None:
    disk = Disk()
    late: list[asyncio.Future[list[str]]] = []

    def flush_and_meet_a_late_caller() -> None:
        disk.flush()
        if not late:
            late.append(asyncio.ensure_future(change_then_wait(disk, commits, "late")))

    commits = GroupCommit(flush_and_meet_a_late_caller)
    assert await change_then_wait(disk, commits, "early") == ["early"]
    assert await late[0] == ["early", "late"]


async def test_a_failing_flush_raises_in_every_caller_it_covered() -> None:
    disk = Disk()
    disk.fail = OSError("disk full")
    commits = GroupCommit(disk.flush)
    results = await asyncio.gather(
        *(change_then_wait(disk, commits, n) for n in "ab"), return_exceptions=True
    )
    assert [str(r) for r in results] == ["disk full", "disk full"]


async def test_the_next_flush_after_a_failure_runs_again() -> None:
    disk = Disk()
    disk.fail = OSError("disk full")
    commits = GroupCommit(disk.flush)
    with pytest.raises(OSError):
        await change_then_wait(disk, commits, "a")
    disk.fail = None
    assert await change_then_wait(disk, commits, "b") == ["a", "b"]


async def test_a_caller_that_gives_up_leaves_the_flush_to_the_others() -> None:
    """A kubelet call cancelled at its deadline while waiting for the flush: the other
    callers of that turn are still answered after it, and the flush runs once."""
    disk = Disk()
    commits = GroupCommit(disk.flush)
    quitter = asyncio.ensure_future(change_then_wait(disk, commits, "gone"))
    stayer = asyncio.ensure_future(change_then_wait(disk, commits, "kept"))
    await asyncio.sleep(0)  # both wait on the pending flush
    quitter.cancel()
    assert await stayer == ["gone", "kept"]
    assert quitter.cancelled()
    assert commits.flushes == 1
