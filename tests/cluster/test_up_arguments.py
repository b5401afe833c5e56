"""`qshare up` refuses what cannot work before it starts anything, naming the option."""

from __future__ import annotations

import socket

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
