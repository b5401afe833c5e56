"""The node agent warns, once, when a process attaches from a PID namespace it cannot see
(the driver records such a pid as 0): a later restart could not adopt that process."""

from __future__ import annotations

import logging

import pytest

from qshare_driver import Event, EventKind
from qshare_node_agent.hidden_pids import HiddenPidWatch


def attach(pid: int, vgpu: int = 3) -> Event:
    return Event(seq=1, time_ns=1, kind=EventKind.ATTACH, card=0, vgpu=vgpu, pid=pid, value=0)


def test_an_attach_with_pid_0_is_warned_of_naming_the_vgpu_and_the_fix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    watch = HiddenPidWatch("n1")
    with caplog.at_level(logging.WARNING, logger="qshare_node_agent.hidden_pids"):
        watch(attach(0))
    (said,) = [r.getMessage() for r in caplog.records]
    assert "vGPU 3" in said and "hostPID: true" in said


def test_the_warning_is_said_once_and_every_such_attach_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    watch = HiddenPidWatch("n1")
    with caplog.at_level(logging.WARNING, logger="qshare_node_agent.hidden_pids"):
        for _ in range(3):
            watch(attach(0))
    assert len(caplog.records) == 1 and watch.hidden == 3


def test_an_attach_the_agent_can_see_is_not_warned_of(caplog: pytest.LogCaptureFixture) -> None:
    watch = HiddenPidWatch("n1")
    with caplog.at_level(logging.WARNING, logger="qshare_node_agent.hidden_pids"):
        watch(attach(4242))
    assert caplog.records == [] and watch.hidden == 0
