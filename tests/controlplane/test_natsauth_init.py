"""`python -m qshare.natsauth init`: a node name NATS cannot carry, or a directory it cannot
write, is one line naming it, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from qshare.natsauth import main


def test_a_node_name_an_identity_cannot_carry_is_refused_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["init", str(tmp_path), "--node", "bad name*"])
    assert exited.value.code == 2
    assert "argument --node: 'bad name*' is not a node name" in capsys.readouterr().err


def test_a_directory_it_cannot_write_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert main(["init", str(blocked / "secrets")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"python -m qshare.natsauth: cannot write {blocked / 'secrets'}: ")
    assert "Traceback" not in err


def test_a_dotted_node_name_is_taken(tmp_path: Path) -> None:
    assert main(["init", str(tmp_path), "--node", "gpu-1.rack-2"]) == 0
    assert (tmp_path / "node-gpu-1.rack-2.password").exists()
