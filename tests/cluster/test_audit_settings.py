"""Node agent settings the driver would refuse are refused as settings, naming the flag,
before the agent starts anything (its health server, the cards' timeslice); a segment the
driver refuses at start (another live agent's, a missing directory) ends the agent with one
line saying why, not a traceback."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from qshare_node_agent.__main__ import main


@pytest.mark.parametrize("segment", ["bad/name", "x" * 48, ".hidden", "sp ace"])
def test_a_segment_name_the_driver_refuses_is_named_as_a_setting(
    segment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--segment", segment, "--simulate", "1", "--name", "n1"]) == 2
    err = capsys.readouterr().err
    assert f"qshare node agent: --segment={segment!r}" in err


@pytest.fixture
def owned(tmp_path: Path) -> Iterator[Path]:
    """A segment directory where segment `qshare-n1` is owned by another live process."""
    script = (
        "import sys, time\n"
        "from qshare_driver.node import Node\n"
        f"n = Node.create('qshare-n1', {str(tmp_path)!r})\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None and owner.stdout.readline() == "up\n"
        yield tmp_path
    finally:
        owner.kill()
        owner.wait()


def test_an_agent_whose_segment_a_live_agent_owns_exits_with_one_line_saying_so(
    owned: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--simulate", "1", "--name", "n1", "--shm-dir", str(owned)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("qshare node agent: cannot start: ")
    assert "is owned by process" in err[0]


def test_an_agent_whose_segment_directory_is_missing_exits_with_one_line_saying_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing"
    assert main(["--simulate", "1", "--name", "n1", "--shm-dir", str(missing)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [f"qshare node agent: cannot start: {missing}/qshare.qshare-n1.cfg: No such "
                   "file or directory"]  # fmt: skip


def test_an_agent_without_its_nats_identity_file_exits_with_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As README's by-hand start shows it: a node whose identity was not generated yet
    (`python -m qshare.natsauth init DIR --node NAME`); before, a traceback."""
    monkeypatch.setenv("QSHARE_NODE_NATS_SECRETS_DIR", str(tmp_path))
    assert main(["--simulate", "1", "--name", "n1", "--shm-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [f"qshare node agent: cannot start: no NATS identity node-n1: "
                   f"{tmp_path}/node-n1.password is missing"]  # fmt: skip
