"""The secrets `python -m qshare.kube_secrets` (and `qshare.natsauth init`) writes: readable by
their owner only, and a rerun after an interrupted one leaves no empty secret behind."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from qshare.kube_secrets import main
from qshare.natsauth import ADMIN_TOKEN_FILE, CONFIG_FILE


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def secret_files(directory: Path) -> list[Path]:
    return [*directory.glob("*.password"), directory / CONFIG_FILE, directory / ADMIN_TOKEN_FILE]


def test_every_secret_and_the_directory_are_readable_by_their_owner_only(tmp_path: Path) -> None:
    directory = tmp_path / "secrets"
    assert main([str(directory), "--node", "gpu-1"]) == 0
    assert mode(directory) & 0o077 == 0
    assert {path.name: mode(path) for path in secret_files(directory)} == {
        path.name: 0o600 for path in secret_files(directory)
    }


def test_a_rerun_makes_an_admin_token_others_could_read_owner_only(tmp_path: Path) -> None:
    assert main([str(tmp_path), "--node", "gpu-1"]) == 0
    token = tmp_path / ADMIN_TOKEN_FILE
    token.chmod(0o644)
    assert main([str(tmp_path)]) == 0
    assert mode(token) == 0o600


@pytest.mark.parametrize("name", ["api.password", "node-gpu-1.password", ADMIN_TOKEN_FILE])
def test_a_secret_an_interrupted_run_left_empty_is_generated_again(
    tmp_path: Path, name: str
) -> None:
    assert main([str(tmp_path), "--node", "gpu-1"]) == 0
    (tmp_path / name).write_text("")
    assert main([str(tmp_path), "--node", "gpu-1"]) == 0
    assert len((tmp_path / name).read_text().strip()) >= 16
    if name.endswith(".password"):
        assert '"password": ""' not in (tmp_path / CONFIG_FILE).read_text()


def test_a_directory_it_cannot_write_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert main([str(blocked / "secrets")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"python -m qshare.kube_secrets: cannot write {blocked / 'secrets'}: ")
    assert "Traceback" not in err and len(err.splitlines()) == 1
