"""A service still starting (its NATS server not up yet) stops on SIGTERM or SIGINT, as
Kubernetes and a person at the terminal expect, instead of retrying on until SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from qshare.testing.servers import free_port

WAITING_WITHIN_S = 60.0
"""Bounds the wait for the service to be waiting for NATS (importing it alone takes seconds
on a loaded machine); it only stops a broken test, it asserts no timing."""
STOPPED_WITHIN_S = 15.0
WAITING_FOR_NATS = "NATS error"
"""What the service logs each time its NATS server refuses it: it is in its start, its stop
signals handled."""


def _waiting_for_nats(module: str, prefix: str) -> subprocess.Popen[str]:
    """`python -m module` whose NATS and Postgres servers are ports nobody listens on."""
    env = dict(
        os.environ,
        **{
            f"{prefix}_NATS_URL": f"nats://127.0.0.1:{free_port()}",
            f"{prefix}_DATABASE_URL": f"postgresql://q:q@127.0.0.1:{free_port()}/q",
            f"{prefix}_MIGRATE_ON_START": "false",
            f"{prefix}_PORT": str(free_port()),
        },
    )
    return subprocess.Popen(
        [sys.executable, "-m", module], env=env, stderr=subprocess.PIPE, text=True
    )


def _stopped(process: subprocess.Popen[str], sig: signal.Signals) -> tuple[int | None, str]:
    """The exit status after `sig`, sent once it waits for NATS (None: still running, then
    killed), and what it logged. A signal sent after a fixed time could come while the
    service was still importing, before it handles stop signals, and kill it."""
    lines: list[str] = []
    reader = threading.Thread(target=_read_into, args=(process, lines), daemon=True)
    reader.start()
    _until_waiting_for_nats(process, lines)
    process.send_signal(sig)
    try:
        status: int | None = process.wait(STOPPED_WITHIN_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        status = None
    reader.join(10)
    return status, "".join(lines)


def _read_into(process: subprocess.Popen[str], lines: list[str]) -> None:
    assert process.stderr is not None
    for line in process.stderr:
        lines.append(line)


def _until_waiting_for_nats(process: subprocess.Popen[str], lines: list[str]) -> None:
    deadline = time.monotonic() + WAITING_WITHIN_S
    while not any(WAITING_FOR_NATS in line for line in list(lines)):
        assert process.poll() is None, "it should still be waiting for NATS: " + "".join(lines)
        assert time.monotonic() < deadline, "it never said it waits for NATS: " + "".join(lines)
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("module", "prefix"),
    [
        ("qshare_allocator", "QSHARE_ALLOCATOR"),
        ("qshare_preemptor", "QSHARE_PREEMPTOR"),
        ("qshare_api", "QSHARE_API"),
    ],
)
def test_a_service_waiting_for_nats_stops_on_sigterm(module: str, prefix: str) -> None:
    status, log = _stopped(_waiting_for_nats(module, prefix), signal.SIGTERM)
    assert status == 0, log[-2000:]
    assert "asked to stop while starting" in log


def test_a_service_waiting_for_nats_stops_on_ctrl_c() -> None:
    status, log = _stopped(_waiting_for_nats("qshare_allocator", "QSHARE_ALLOCATOR"), signal.SIGINT)
    assert status == 0, log[-2000:]
    assert "Traceback" not in log


def test_the_api_stopped_while_starting_logs_no_failure() -> None:
    status, log = _stopped(_waiting_for_nats("qshare_api", "QSHARE_API"), signal.SIGINT)
    assert status == 0, log[-2000:]
    assert "Traceback" not in log and "startup failed" not in log
