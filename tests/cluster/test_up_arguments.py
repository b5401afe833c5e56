"""`qshare up` refuses what cannot work before it starts anything, naming the option."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from qshare.cli import main


def test_a_busy_port_is_named_before_anything_starts(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["up", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"qshare up: port {port} on 127.0.0.1 is in use" in err and "--port" in err


@pytest.mark.parametrize(("given", "hint"), [("16G", "did you mean 16Gi?"), ("512Mi", "1Gi")])
def test_a_card_memory_the_agents_cannot_take_is_refused_with_a_hint(
    capsys: pytest.CaptureFixture[str], given: str, hint: str
) -> None:
    with pytest.raises(SystemExit):
        main(["up", "--card-memory", given])
    err = capsys.readouterr().err
    assert "argument --card-memory" in err and hint in err


@pytest.mark.parametrize("problem", ["missing", "a file"])
def test_a_segment_directory_that_is_no_directory_is_named_before_anything_starts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, problem: str
) -> None:
    """Before, Postgres, NATS and the services started, and the first node agent's segment
    ended `qshare up` in a DriverError traceback."""
    given = tmp_path / "no" / "such" if problem == "missing" else tmp_path / "file"
    if problem == "a file":
        given.write_text("")
    with pytest.raises(SystemExit) as stopped:
        main(["up", "--shm-dir", str(given)])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --shm-dir: {str(given)!r} is not a directory" in err
