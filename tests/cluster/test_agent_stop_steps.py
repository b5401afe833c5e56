"""Stopping a node agent runs every step, each bounded: one that raises or hangs (an
announcer, the event pump, the metrics server, the driver segment's close) is logged by
name and left, and the steps after it still close NATS and the segment. A second stop finds
nothing left to do."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from qshare.testing.failing_node import FailingNode
from qshare.testing.servers import free_port
from qshare_driver import layout
from qshare_node_agent.app import NodeAgent

from .conftest import StartAgent


def broken() -> None:
    raise RuntimeError("broken (injected)")


async def broken_async() -> None:
    broken()


@pytest.fixture
def never() -> Iterator[threading.Event]:
    """An event set only when the test ends: a step waiting on it hangs until then."""
    event = threading.Event()
    yield event
    event.set()


def segment_file(agent: NodeAgent, directory: Path) -> Path:
    """The agent's segment's configuration file (there while its owner has it)."""
    path = layout.config_file(agent.settings.segment_name, directory)
    assert path.exists()
    return path


def assert_stopped(agent: NodeAgent, nc_closed: bool, segment: Path) -> None:
    """NATS closed, the segment closed and removed (the tests' agents keep none)."""
    assert nc_closed
    assert agent._node is None
    assert not segment.exists()


@pytest.mark.parametrize("step", ["announcer", "pump"])
async def test_an_async_step_that_raises_leaves_the_later_steps_to_run(
    start_agent: StartAgent, tmp_path: Path, caplog: pytest.LogCaptureFixture, step: str
) -> None:
    agent = await start_agent()
    target = agent.announcer if step == "announcer" else agent._pump
    target.stop = broken_async  # type: ignore[method-assign,union-attr]
    nc, segment = agent._nc, segment_file(agent, tmp_path)
    assert nc is not None
    await asyncio.wait_for(agent.stop(), 30)
    assert_stopped(agent, nc.is_closed, segment)
    assert "failed (RuntimeError('broken (injected)'))" in caplog.text


async def test_a_segment_that_cannot_be_closed_still_lets_the_stop_end(
    start_agent: StartAgent, caplog: pytest.LogCaptureFixture
) -> None:
    agent = await start_agent()
    real = agent.node
    agent._node = FailingNode(real, "close", failures=1)  # type: ignore[assignment]
    await asyncio.wait_for(agent.stop(), 30)
    assert f"driver segment {agent.settings.segment_name} failed" in caplog.text
    real.close()


async def test_a_step_that_hangs_is_left_after_its_bound_and_the_rest_runs(
    start_agent: StartAgent, tmp_path: Path, never: threading.Event,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """A hung announcer (on the loop) and a hung metrics server (in a thread); the bound
    leaves the event pump, whose reader returns from the driver every second, its time."""
    agent = await start_agent(metrics_port=free_port())
    agent.stop_step_s = 2.5
    hung = asyncio.Event()

    async def hangs() -> None:
        await hung.wait()

    assert agent.announcer is not None and agent._metrics is not None
    agent.announcer.stop = hangs  # type: ignore[method-assign]
    agent._metrics.stop = never.wait  # type: ignore[method-assign,assignment]
    nc, segment = agent._nc, segment_file(agent, tmp_path)
    assert nc is not None
    try:
        await asyncio.wait_for(agent.stop(), 15)
    finally:  # what hangs ends with the test, failed or not
        hung.set()
        never.set()
    assert_stopped(agent, nc.is_closed, segment)
    assert "the announcer did not finish within 2.5 s" in caplog.text
    assert "the metrics server did not finish within 2.5 s" in caplog.text


async def test_a_second_stop_finds_nothing_left(start_agent: StartAgent) -> None:
    agent = await start_agent()
    await agent.stop()
    await asyncio.wait_for(agent.stop(), 5)
    assert agent._node is None


class StuckReads:
    """The agent's node, whose event reads block until `release` is set (`entered` once one
    does): the event reader's thread caught inside the driver."""

    def __init__(self, node: object, release: threading.Event) -> None:
        self._node = node
        self.release = release
        self.entered = threading.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self._node, name)

    def next_event(self, timeout_s: float) -> None:
        self.entered.set()
        self.release.wait()


async def test_a_segment_its_event_reader_still_reads_is_left_open_not_unmapped(
    start_agent: StartAgent, tmp_path: Path, never: threading.Event,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """Closing the segment unmaps the ring under a reader still inside `next_event`: the
    stop leaves it (the next agent adopts it) rather than risk the reader's fault."""
    agent = await start_agent()
    agent.stop_step_s = 2.5
    assert agent._pump is not None
    stuck = StuckReads(agent.node, never)
    agent._pump._node = stuck  # type: ignore[assignment]
    assert await asyncio.to_thread(stuck.entered.wait, 10)
    segment = segment_file(agent, tmp_path)
    try:
        await asyncio.wait_for(agent.stop(), 15)
        assert segment.exists()
        assert "left open: the event reader still reads it" in caplog.text
    finally:
        never.set()
    await asyncio.wait_for(agent.stop(), 15)  # the reader gone, a second stop closes it
    assert not segment.exists()
