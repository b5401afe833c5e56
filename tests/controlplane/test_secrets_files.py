"""The secrets `python -m qshare.kube_secrets` (and `qshare.natsauth init`) writes: readable by
their owner only, and a rerun after an interrupted one leaves no empty secret behind."""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from qshare.kube_secrets import main
from qshare.natsauth import ADMIN_TOKEN_FILE, CONFIG_FILE, init_secrets

COMPOSE = Path(__file__).parents[2] / "compose" / "docker-compose.yml"
NOBODY = 65534
"""`nobody` of the image's Debian base, which compose runs the control plane as."""


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


def compose_owner() -> int:
    """The `--owner` compose's `secrets` service gives `natsauth init`."""
    entrypoint = yaml.safe_load(COMPOSE.read_text())["services"]["secrets"]["entrypoint"]
    return int(entrypoint[entrypoint.index("--owner") + 1])


@pytest.mark.skipif(os.geteuid() != 0, reason="reading as another user needs root to switch")
@pytest.mark.parametrize("rerun", [False, True], ids=["first start", "a node added later"])
def test_the_compose_control_plane_running_as_nobody_reads_its_secrets(rerun: bool) -> None:
    assert compose_owner() == NOBODY
    with tempfile.TemporaryDirectory() as top:
        os.chmod(top, 0o755)
        directory = Path(top) / "secrets"
        directory.mkdir()  # the volume's mount point, made by Docker as root
        init_secrets(directory, ["sim-1"], owner=NOBODY)
        if rerun:
            init_secrets(directory, ["sim-1", "sim-2"], owner=NOBODY)
        for name in ["allocator.password", "api.password", "preemptor.password", ADMIN_TOKEN_FILE]:
            read = subprocess.run(["cat", str(directory / name)], user=NOBODY, capture_output=True)
            assert read.returncode == 0 and read.stdout.strip(), (name, read.stderr)
